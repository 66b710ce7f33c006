//! TLS for the store's connections: libpq's `sslmode` and `sslrootcert` in the connection string,
//! on rustls (no OpenSSL). tokio-postgres understands `sslmode=disable|prefer|require` only; this
//! module takes the TLS parameters out of the string, hands the rest to tokio-postgres, and builds
//! the connector.
//!
//! | `sslmode` | TLS | the server's certificate | protects against |
//! | --- | --- | --- | --- |
//! | `disable` | never | - | nothing |
//! | `prefer` (the default) | when the server offers it | not checked (as libpq) | a passive listener, if the server offers TLS; nothing against anyone who can answer for the server |
//! | `require` | always | not checked (as libpq), unless `sslrootcert` is given: then as `verify-ca` | a passive listener |
//! | `verify-ca` | always | signed by the CA in `sslrootcert` (required) | a passive listener, and a server without a certificate from that CA |
//! | `verify-full` | always | signed by a trusted root, and issued for the host connected to | a passive listener, and any server but the one named |
//!
//! Trusted roots: the PEM file named by `sslrootcert`; with `verify-full` only, the system's roots
//! when `sslrootcert` is `system` or absent (the name check makes them safe). As libpq does,
//! `sslrootcert=system` needs `verify-full`, and `verify-ca` needs a root file: the chain alone,
//! checked against every public CA, accepts any publicly issued certificate for any name.
//! Building a store whose URL carries a password over a connection that is not verified (to a
//! host that is not this machine) logs a warning: whoever can answer for the server can ask for
//! the password. Aurora and RDS: `sslmode=verify-full&sslrootcert=/path/to/global-bundle.pem`.

use crate::error::PostgresStoreError;
use std::path::PathBuf;

/// How a connection uses TLS (libpq's `sslmode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain text only.
    Disable,
    /// TLS when the server offers it, without checking its certificate (libpq's default).
    #[default]
    Prefer,
    /// TLS always, without checking the certificate (unless a root certificate is given).
    Require,
    /// TLS always; the certificate must be signed by a trusted root.
    VerifyCa,
    /// TLS always; the certificate must be signed by a trusted root and name the host.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, PostgresStoreError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(PostgresStoreError::InvalidTls(format!(
                    "unknown sslmode {other:?}: use disable, prefer, require, verify-ca or verify-full"
                )));
            }
        })
    }
}

/// The parameters of a connection string that tokio-postgres does not take: TLS, and whether
/// statements may be prepared (`prepared_statements=false` behind a transaction pooler).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    pub(crate) mode: SslMode,
    /// `sslrootcert`: a PEM file of trusted roots; `None` for the system's roots.
    pub(crate) root_cert: Option<PathBuf>,
    /// `sslrootcert=system` was given.
    pub(crate) system_roots: bool,
    /// `prepared_statements`: `false` sends every statement unnamed.
    pub(crate) prepared_statements: bool,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings {
            mode: SslMode::default(),
            root_cert: None,
            system_roots: false,
            prepared_statements: true,
        }
    }
}

/// Takes `sslmode`, `sslrootcert` and `prepared_statements` out of a connection string (URL or
/// `key=value` form); returns the rest, for tokio-postgres, and the settings.
pub(crate) fn split(url: &str) -> Result<(String, TlsSettings), PostgresStoreError> {
    let mut settings = TlsSettings::default();
    let mut take = |key: &str, value: &str| -> Result<bool, PostgresStoreError> {
        match key {
            "sslmode" => settings.mode = SslMode::parse(value)?,
            "sslrootcert" if value == "system" => {
                settings.root_cert = None;
                settings.system_roots = true;
            }
            "sslrootcert" => {
                settings.root_cert = Some(PathBuf::from(value));
                settings.system_roots = false;
            }
            "prepared_statements" => {
                settings.prepared_statements = match value {
                    "true" | "on" | "1" => true,
                    "false" | "off" | "0" => false,
                    other => {
                        return Err(PostgresStoreError::InvalidTls(format!(
                            "prepared_statements must be true or false, not {other:?}"
                        )));
                    }
                }
            }
            "sslcert" | "sslkey" => {
                return Err(PostgresStoreError::InvalidTls(
                    "client certificates (sslcert, sslkey) are not supported".to_owned(),
                ));
            }
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_owned(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    if !take(key, &percent_decode(value)?)? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let mut kept = Vec::new();
        for word in url.split_whitespace() {
            let (key, value) = word.split_once('=').unwrap_or((word, ""));
            if !take(key.trim(), value.trim_matches('\''))? {
                kept.push(word);
            }
        }
        kept.join(" ")
    };
    if settings.mode == SslMode::Require && settings.root_cert.is_some() {
        // libpq: with a root certificate, `require` verifies the chain.
        settings.mode = SslMode::VerifyCa;
    }
    if settings.system_roots && settings.mode != SslMode::VerifyFull {
        return Err(PostgresStoreError::InvalidTls(
            "sslrootcert=system trusts every public CA, so it needs sslmode=verify-full (as \
             libpq requires): without the host name check any publicly issued certificate passes"
                .to_owned(),
        ));
    }
    if settings.mode == SslMode::VerifyCa && settings.root_cert.is_none() {
        return Err(PostgresStoreError::InvalidTls(
            "sslmode=verify-ca checks the certificate's chain but not its host name, so it needs \
             sslrootcert naming your server's CA (a PEM file): against the system's roots any \
             publicly issued certificate would pass. Or use sslmode=verify-full"
                .to_owned(),
        ));
    }
    Ok((rest, settings))
}

/// Whether `host` names this machine.
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn percent_decode(value: &str) -> Result<String, PostgresStoreError> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    PostgresStoreError::InvalidTls(format!("bad percent-encoding in {value:?}"))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| PostgresStoreError::InvalidTls(format!("{value:?} is not UTF-8")))
}

impl TlsSettings {
    /// Why a connection with these settings would expose the password of `config`, if it
    /// would: a password is set, a host is not this machine, and the server's certificate is
    /// not verified (whoever can answer for the server can ask for the password).
    pub(crate) fn password_exposure(&self, config: &tokio_postgres::Config) -> Option<String> {
        use tokio_postgres::config::Host;
        if config.get_password().is_none()
            || matches!(self.mode, SslMode::VerifyCa | SslMode::VerifyFull)
        {
            return None;
        }
        let remote = config.get_hosts().iter().any(|host| match host {
            Host::Tcp(name) => !is_loopback(name),
            #[cfg(unix)]
            Host::Unix(_) => false,
        });
        if !remote {
            return None;
        }
        let how = match self.mode {
            SslMode::Disable => "in plain text (sslmode=disable)",
            SslMode::Prefer => {
                "over TLS only if the server offers it, to a server whose certificate is not \
                 checked (sslmode=prefer, the default)"
            }
            _ => "to a server whose certificate is not checked (sslmode=require)",
        };
        Some(format!(
            "the database password is sent {how}: anyone who can answer for the server can ask \
             for it. Use sslmode=verify-full with sslrootcert=<your CA's PEM file>"
        ))
    }

    /// tokio-postgres' own mode for these settings.
    pub(crate) fn tokio_postgres_mode(&self) -> tokio_postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

/// One plain tokio-postgres connection to `url`, with the store's reading of the URL (TLS per
/// `sslmode` and `sslrootcert`): for tools and benchmarks that send SQL without the store
/// (feature `raw-connection`). Its connection task is spawned on the current Tokio runtime.
#[cfg(feature = "raw-connection")]
pub async fn connect_raw(url: &str) -> Result<tokio_postgres::Client, PostgresStoreError> {
    use std::str::FromStr;
    let (rest, settings) = split(url)?;
    let mut config =
        tokio_postgres::Config::from_str(&rest).map_err(PostgresStoreError::InvalidUrl)?;
    if let Some(why) = settings.password_exposure(&config) {
        tracing::warn!("{why}");
    }
    config.ssl_mode(settings.tokio_postgres_mode());
    let client = match Connector::for_settings(&settings)? {
        Connector::Plain(tls) => {
            let (client, connection) = config.connect(tls).await?;
            tokio::spawn(connection);
            client
        }
        #[cfg(feature = "tls")]
        Connector::Rustls(tls) => {
            let (client, connection) = config.connect(tls).await?;
            tokio::spawn(connection);
            client
        }
    };
    Ok(client)
}

/// The connector for the settings: plain, or rustls.
pub(crate) enum Connector {
    Plain(tokio_postgres::NoTls),
    #[cfg(feature = "tls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

impl Connector {
    pub(crate) fn for_settings(settings: &TlsSettings) -> Result<Connector, PostgresStoreError> {
        if settings.mode == SslMode::Disable {
            return Ok(Connector::Plain(tokio_postgres::NoTls));
        }
        #[cfg(feature = "tls")]
        {
            rustls_connector::make(settings).map(Connector::Rustls)
        }
        #[cfg(not(feature = "tls"))]
        match settings.mode {
            SslMode::Prefer => Ok(Connector::Plain(tokio_postgres::NoTls)),
            _ => Err(PostgresStoreError::InvalidTls(
                "sslmode needs TLS, and this build has none: enable the `tls` feature of \
                 idempotency-postgres (or `postgres-tls` of idempotency)"
                    .to_owned(),
            )),
        }
    }
}

#[cfg(feature = "tls")]
mod rustls_connector;

#[cfg(test)]
mod tests;
