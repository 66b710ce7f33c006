//! Which database errors a retry cannot cure, by their SQLSTATE.

/// Whether an error with SQLSTATE `code` refuses the **input itself**, so the same statement
/// with the same values fails every time: a retry (a requeued message, a resent request) can
/// never succeed, and the failure should be recorded as a refusal
/// ([`OnceContext::discard_writes`](idempotency_core::OnceContext::discard_writes)) or
/// dead-lettered rather than retried.
///
/// Permanent: class `22` (data exception: a NUL byte in text `22021`, a value out of range,
/// an invalid date), `23` (integrity constraint: check, not-null, unique) and `44`
/// (`WITH CHECK OPTION`). Not a foreign key violation (`23503`): the row it needs may be written
/// later by another message or request (a child that arrived before its parent), so it is taken
/// as transient, never recorded as a refusal. Everything else is taken as transient too: the
/// connection (`08`),
/// serialization failures and deadlocks (`40`), resources (`53`), locks and timeouts (`55`,
/// `57`), the server (`58`, `XX`), and also schema and privilege errors (`42`: a table not
/// migrated yet, a missing grant), which the deployment fixes rather than the input. Bound the
/// retries of those anyway (a delivery limit).
///
/// ```
/// use idempotency_postgres::is_permanent_sqlstate;
/// assert!(is_permanent_sqlstate("22021")); // invalid byte sequence (a NUL in text)
/// assert!(is_permanent_sqlstate("23514")); // check constraint
/// assert!(!is_permanent_sqlstate("40001")); // serialization failure: retry
/// assert!(!is_permanent_sqlstate("08006")); // connection failure: retry
/// ```
///
/// With tokio-postgres: `error.code().is_some_and(|c| is_permanent_sqlstate(c.code()))`; with
/// sqlx: `error.as_database_error().and_then(|e| e.code()).is_some_and(|c| is_permanent_sqlstate(&c))`.
pub fn is_permanent_sqlstate(code: &str) -> bool {
    code != FOREIGN_KEY_VIOLATION && matches!(code.get(..2), Some("22" | "23" | "44"))
}

/// A foreign key violation: the referenced row may exist later.
const FOREIGN_KEY_VIOLATION: &str = "23503";

#[cfg(test)]
mod tests {
    use super::is_permanent_sqlstate;

    #[test]
    fn the_input_s_errors_are_permanent_and_the_rest_transient() {
        for code in [
            "22021", "22003", "22P02", "23505", "23514", "23502", "44000",
        ] {
            assert!(is_permanent_sqlstate(code), "{code}");
        }
        for code in [
            "23503", "08006", "40001", "40P01", "53300", "55P03", "57014", "57P01", "58030",
            "XX000", "42P01", "42501", "25P02", "25P03", "", "2",
        ] {
            assert!(!is_permanent_sqlstate(code), "{code}");
        }
    }
}
