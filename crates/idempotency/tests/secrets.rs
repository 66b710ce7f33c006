//! No message that `connect` can produce shows the password of the address it was given.

const SECRET: &str = "hunter2x";

/// The error of `connect(address)`, as `Display` (with its causes) and `Debug` show it.
async fn shown(address: &str) -> String {
    match idempotency::connect(address).await {
        Ok(_) => panic!("{address} must fail"),
        Err(error) => format!("{} / {error:?}", idempotency::ErrorChain(&error)),
    }
}

#[tokio::test]
async fn an_unsupported_address_is_named_without_its_password() {
    for address in [
        format!("mysql://app:{SECRET}@db.internal/app"),
        format!("host=db.internal user=app password={SECRET}"),
    ] {
        let text = shown(&address).await;
        assert!(!text.contains(SECRET), "{text}");
        assert!(text.contains("unsupported store"), "{text}");
    }
}

/// Servers that refuse the connection (nothing listens on port 1).
#[cfg(all(feature = "postgres", feature = "redis"))]
#[tokio::test]
async fn an_unreachable_server_is_named_without_its_password() {
    for address in [
        format!("postgres://app:{SECRET}@127.0.0.1:1/app"),
        format!("postgres://127.0.0.1:1/app?user=app&password={SECRET}"),
        format!("redis://:{SECRET}@127.0.0.1:1/0"),
        format!("redis+cluster://app:{SECRET}@127.0.0.1:1,127.0.0.1:2"),
    ] {
        let text = shown(&address).await;
        assert!(!text.contains(SECRET), "{address}: {text}");
    }
}

/// Addresses that do not parse.
#[cfg(all(feature = "postgres", feature = "redis"))]
#[tokio::test]
async fn a_malformed_address_is_refused_without_its_password() {
    for address in [
        format!("postgres://app:{SECRET}@127.0.0.1:notaport/app"),
        format!("postgres://app:{SECRET}@127.0.0.1/app?sslmode=sometimes"),
        format!("redis://app:{SECRET}@127.0.0.1:notaport"),
    ] {
        let text = shown(&address).await;
        assert!(!text.contains(SECRET), "{address}: {text}");
    }
}
