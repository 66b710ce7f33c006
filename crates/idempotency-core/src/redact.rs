//! Store addresses with their secrets hidden, for every message that shows one.

use std::borrow::Cow;

/// What a hidden secret is shown as.
const HIDDEN: &str = "***";

/// `address` with its password hidden, for logs and error messages: the password of a URL's
/// user information (`postgres://app:secret@db/app` becomes `postgres://app:***@db/app`, also in
/// each node of `redis+cluster://user:pw@h1:p1,h2:p2`), and the value of every `password`
/// parameter, in a URL's query (`?password=secret`) or in a libpq key/value string
/// (`host=db password='se cret'`). An address with nothing to hide is borrowed as it is.
///
/// ```
/// use idempotency_core::redact_credentials;
///
/// assert_eq!(
///     redact_credentials("postgres://app:hunter2@db.internal/app?sslmode=verify-full"),
///     "postgres://app:***@db.internal/app?sslmode=verify-full"
/// );
/// assert_eq!(
///     redact_credentials("host=db user=app password='hunter 2' dbname=app"),
///     "host=db user=app password=*** dbname=app"
/// );
/// assert_eq!(redact_credentials("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
/// ```
pub fn redact_credentials(address: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(address);
    if let Some((scheme, rest)) = address.split_once("://") {
        // The user information ends at the last '@' before the query. Searched past the first
        // '/' too, so that a password with an unencoded '/' is still hidden (hiding too much
        // of a strange address is the safe way to be wrong).
        let authority_end = rest.find(['?', '#']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        if let Some(at) = authority.rfind('@')
            && let Some(colon) = authority[..at].find(':')
        {
            out = Cow::Owned(format!(
                "{scheme}://{}:{HIDDEN}{}",
                &authority[..colon],
                &rest[at..]
            ));
        }
    }
    match hide_password_parameters(&out) {
        Some(hidden) => Cow::Owned(hidden),
        None => out,
    }
}

/// Hides the value of each `password=` parameter (a query's `&`-separated one, or a libpq
/// key/value one, possibly single-quoted with backslash escapes); `None` when there is none.
fn hide_password_parameters(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let mut out = String::new();
    let mut copied = 0;
    let mut search = 0;
    while let Some(found) = lower[search..].find("password") {
        let start = search + found;
        search = start + "password".len();
        // A parameter name starts the text or follows a separator.
        let starts_parameter = start == 0
            || matches!(
                text.as_bytes()[start - 1],
                b'?' | b'&' | b';' | b' ' | b'\t' | b'\n'
            );
        let after_name = text[search..].trim_start_matches([' ', '\t']);
        if !starts_parameter || !after_name.starts_with('=') {
            continue;
        }
        let value_start = text.len() - after_name.len() + 1;
        let value = text[value_start..].trim_start_matches([' ', '\t']);
        let value_start = text.len() - value.len();
        let value_len = if let Some(quoted) = value.strip_prefix('\'') {
            // A libpq quoted value: up to the first unescaped quote.
            let mut escaped = false;
            let end = quoted
                .char_indices()
                .find(|&(_, c)| {
                    let closes = c == '\'' && !escaped;
                    escaped = c == '\\' && !escaped;
                    closes
                })
                .map_or(quoted.len(), |(i, _)| i + 1);
            1 + end
        } else {
            value
                .find(['&', '#', ' ', '\t', '\n'])
                .unwrap_or(value.len())
        };
        out.push_str(&text[copied..value_start]);
        out.push_str(HIDDEN);
        copied = value_start + value_len;
        search = copied;
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::redact_credentials;

    #[test]
    fn passwords_are_hidden_wherever_an_address_carries_one() {
        for (address, shown) in [
            ("postgres://app:hunter2@db/app", "postgres://app:***@db/app"),
            (
                "postgresql://app:p%40ss@db:5432",
                "postgresql://app:***@db:5432",
            ),
            (
                "redis://:hunter2@127.0.0.1:6379/0",
                "redis://:***@127.0.0.1:6379/0",
            ),
            (
                "rediss+cluster://u:hunter2@h1:7000,h2:7001",
                "rediss+cluster://u:***@h1:7000,h2:7001",
            ),
            (
                "postgres://db/app?user=app&password=hunter2&sslmode=require",
                "postgres://db/app?user=app&password=***&sslmode=require",
            ),
            (
                "host=db password=hunter2 user=app",
                "host=db password=*** user=app",
            ),
            (
                "host=db password = 'hun\\'ter 2' user=app",
                "host=db password = *** user=app",
            ),
            ("PASSWORD=hunter2", "PASSWORD=***"),
            ("postgres://app:a/b@c@db/app", "postgres://app:***@db/app"),
            // Nothing to hide.
            ("postgres://app@db/app", "postgres://app@db/app"),
            ("memory", "memory"),
            (
                "postgres://db/app?passwordless=1",
                "postgres://db/app?passwordless=1",
            ),
            ("host=db user=password_admin", "host=db user=password_admin"),
        ] {
            assert_eq!(redact_credentials(address), shown, "{address}");
        }
    }
}
