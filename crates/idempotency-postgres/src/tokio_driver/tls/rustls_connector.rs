//! The rustls connector: the certificate checks of each `sslmode`.

use super::{SslMode, TlsSettings};
use crate::error::PostgresStoreError;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;

fn invalid(message: String) -> PostgresStoreError {
    PostgresStoreError::InvalidTls(message)
}

pub(super) fn make(
    settings: &TlsSettings,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, PostgresStoreError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS setup: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match settings.mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => Arc::new(EncryptOnly {
            algorithms: provider.signature_verification_algorithms,
        }),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = Arc::new(roots(settings)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| invalid(format!("TLS setup: {e}")))?;
            if settings.mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(AnyName { webpki })
            }
        }
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

fn roots(settings: &TlsSettings) -> Result<RootCertStore, PostgresStoreError> {
    let mut roots = RootCertStore::empty();
    match &settings.root_cert {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| invalid(format!("cannot read sslrootcert {}: {e}", path.display())))?;
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    invalid(format!(
                        "sslrootcert {} holds a bad certificate: {e}",
                        path.display()
                    ))
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system store can hold certificates rustls does not parse: skip them.
                let _ = roots.add(cert);
            }
        }
    }
    if roots.is_empty() {
        return Err(invalid(
            "no trusted root certificates: set sslrootcert to a PEM file of the server's CA"
                .to_owned(),
        ));
    }
    Ok(roots)
}

/// `sslmode=prefer|require` without a root: encrypted, but any certificate is accepted, as
/// libpq does. The handshake's signatures are still checked.
#[derive(Debug)]
struct EncryptOnly {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain must reach a trusted root; the name is not checked.
#[derive(Debug)]
struct AnyName {
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
