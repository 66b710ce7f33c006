//! Tests of `tls`.

use super::*;

#[test]
fn tls_parameters_are_taken_out_of_urls_and_key_value_strings() {
    let (rest, s) = split(
        "postgres://u:p@db.example:5432/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x",
    )
    .unwrap();
    assert_eq!(
        rest,
        "postgres://u:p@db.example:5432/app?application_name=x"
    );
    assert_eq!(s.mode, SslMode::VerifyFull);
    assert_eq!(s.root_cert, Some(PathBuf::from("/etc/ca.pem")));
    let (rest, s) = split("postgres://db/app?sslmode=require").unwrap();
    assert_eq!(
        (rest.as_str(), s.mode),
        ("postgres://db/app", SslMode::Require)
    );
    let (rest, s) = split("host=db user=u sslmode=require sslrootcert=/ca.pem").unwrap();
    assert_eq!(rest, "host=db user=u");
    assert_eq!(
        s.mode,
        SslMode::VerifyCa,
        "require with a root verifies the chain"
    );
    let (_, s) = split("postgres://db/app").unwrap();
    assert_eq!(s, TlsSettings::default());
    let (rest, s) = split("postgres://bouncer:6432/app?prepared_statements=false").unwrap();
    assert_eq!(
        (rest.as_str(), s.prepared_statements),
        ("postgres://bouncer:6432/app", false)
    );
    assert!(split("postgres://db/app?sslmode=verify-everything").is_err());
    assert!(split("postgres://db/app?sslcert=/c.pem").is_err());
}

/// Issue 28 item 2: no mode trusts the system's roots without checking the host name.
#[test]
fn the_system_roots_are_trusted_only_with_the_host_name_checked() {
    let refused = |url: &str| match split(url) {
        Err(PostgresStoreError::InvalidTls(why)) => why,
        other => panic!("{url} must be refused, got {other:?}"),
    };
    assert!(refused("postgres://db/app?sslmode=verify-ca").contains("sslrootcert"));
    assert!(
        refused("postgres://db/app?sslmode=verify-ca&sslrootcert=system").contains("verify-full")
    );
    assert!(
        refused("postgres://db/app?sslmode=require&sslrootcert=system").contains("verify-full")
    );
    assert!(refused("postgres://db/app?sslrootcert=system").contains("verify-full"));
    let (_, s) = split("postgres://db/app?sslmode=verify-full&sslrootcert=system").unwrap();
    assert_eq!(
        (s.mode, s.root_cert, s.system_roots),
        (SslMode::VerifyFull, None, true)
    );
    let (_, s) = split("postgres://db/app?sslmode=verify-full").unwrap();
    assert_eq!((s.mode, s.root_cert), (SslMode::VerifyFull, None));
    let (_, s) = split("postgres://db/app?sslmode=verify-ca&sslrootcert=%2Fca.pem").unwrap();
    assert_eq!(s.mode, SslMode::VerifyCa);
}

#[test]
fn a_password_to_an_unverified_remote_server_is_named() {
    use std::str::FromStr;
    let exposure = |url: &str| {
        let (rest, settings) = split(url).unwrap();
        let config = tokio_postgres::Config::from_str(&rest).unwrap();
        settings.password_exposure(&config)
    };
    for url in [
        "postgres://app:secret@db.internal/app",
        "postgres://app:secret@db.internal/app?sslmode=require",
        "postgres://app:secret@db.internal/app?sslmode=disable",
        "postgres://app:secret@10.0.0.5/app?sslmode=prefer",
    ] {
        let why = exposure(url).unwrap_or_else(|| panic!("{url} must warn"));
        assert!(
            why.contains("verify-full") && !why.contains("secret"),
            "{why}"
        );
    }
    for url in [
        "postgres://app:secret@db.internal/app?sslmode=verify-full",
        "postgres://app:secret@db.internal/app?sslmode=verify-ca&sslrootcert=%2Fca.pem",
        "postgres://app@db.internal/app",
        "postgres://app:secret@127.0.0.1/app",
        "postgres://app:secret@localhost/app?sslmode=disable",
        "postgres://app:secret@[::1]/app",
    ] {
        assert_eq!(exposure(url), None, "{url}");
    }
}
