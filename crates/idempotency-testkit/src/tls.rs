//! A throwaway certificate authority, for tests of TLS connections.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use std::io;
use std::path::{Path, PathBuf};

/// A certificate authority made for one test: its root certificate is written to a PEM file
/// (what a client trusts, as `sslrootcert` or a Redis root certificate), and it issues server
/// certificates for given names.
pub struct TestCa {
    dir: tempfile::TempDir,
    certificate: rcgen::Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa")
            .field("root", &self.root_path())
            .finish_non_exhaustive()
    }
}

/// A server certificate and its key, in PEM.
#[derive(Debug, Clone)]
pub struct ServerCert {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl TestCa {
    /// A new CA named `name`, its root written to [`TestCa::root_path`].
    pub fn new(name: &str) -> io::Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(other)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().map_err(other)?;
        let certificate = params.self_signed(&key).map_err(other)?;
        let dir = tempfile::Builder::new().prefix("idem-ca-").tempdir()?;
        std::fs::write(dir.path().join("root.pem"), certificate.pem())?;
        Ok(TestCa {
            dir,
            certificate,
            key,
        })
    }

    /// The PEM file of the root certificate.
    pub fn root_path(&self) -> PathBuf {
        self.dir.path().join("root.pem")
    }

    /// A server certificate for `names` (DNS names or IP addresses), signed by this CA.
    pub fn issue(&self, names: &[&str]) -> io::Result<ServerCert> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).map_err(other)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "idempotency test server");
        let key = KeyPair::generate().map_err(other)?;
        let cert = params
            .signed_by(&key, &self.certificate, &self.key)
            .map_err(other)?;
        Ok(ServerCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

impl ServerCert {
    /// Writes `server.crt` and `server.key` into `dir`; the key readable by its owner only.
    pub(crate) fn write_into(&self, dir: &Path) -> io::Result<(PathBuf, PathBuf)> {
        use std::os::unix::fs::PermissionsExt;
        let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
        std::fs::write(&cert, &self.cert_pem)?;
        std::fs::write(&key, &self.key_pem)?;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        Ok((cert, key))
    }
}
