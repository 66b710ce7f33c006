//! Tests of `schema`.

use super::*;

#[test]
fn identifiers_are_validated() {
    assert!(TableName::new("public", "idempotency_keys").is_ok());
    for bad in ["", "1abc", "a-b", "a\"b", "a b", "ä", &"x".repeat(49)] {
        assert!(TableName::new(bad, "t").is_err(), "{bad:?}");
        assert!(TableName::new("s", bad).is_err(), "{bad:?}");
    }
}

fn render(version: i32, name: &TableName, mode: TableMode, schedule: &str) -> String {
    crate::migrate::MIGRATIONS
        .iter()
        .find(|m| m.version == version)
        .unwrap()
        .render(name, mode, schedule)
}

#[test]
fn create_table_renders_the_mode() {
    let name = TableName::new("app", "keys").unwrap();
    let unlogged = render(1, &name, TableMode::Unlogged, "");
    assert!(unlogged.contains("CREATE UNLOGGED TABLE IF NOT EXISTS \"app\".\"keys\""));
    assert!(unlogged.contains("\"keys_expires_at_idx\""));
    let logged = render(1, &name, TableMode::Logged, "");
    assert!(logged.contains("CREATE TABLE IF NOT EXISTS \"app\".\"keys\""));
    assert!(!logged.contains('{'), "unfilled placeholder in {logged}");
}

#[test]
fn purge_job_escapes_its_literals() {
    let name = TableName::new("app", "keys").unwrap();
    let sql = render(2, &name, TableMode::Unlogged, "0 * * * *");
    assert!(sql.contains("PERFORM cron.schedule('idempotency-purge:app.keys', '0 * * * *', 'DELETE FROM \"app\".\"keys\" WHERE expires_at <= now()');"));
    let hostile = render(2, &name, TableMode::Unlogged, "'); DROP TABLE x; --");
    assert!(hostile.contains("''); DROP TABLE x; --'"));
}

#[test]
fn lock_ids_are_stable_and_apart_per_table() {
    let keys = Statements::new(
        &TableName::new("public", "idempotency_keys").unwrap(),
        TableMode::Logged,
    );
    let other = Statements::new(&TableName::new("app", "keys").unwrap(), TableMode::Logged);
    // Pinned: instances of one deployment must agree on a key's lock id, so a change of the
    // hash is a deliberate one (a rolling upgrade then runs two ids for a while, and the
    // unique index alone answers duplicates that straddle the two versions).
    assert_eq!(keys.lock_id("user-1", "key-1"), PINNED);
    assert_ne!(
        keys.lock_id("user-1", "key-1"),
        other.lock_id("user-1", "key-1")
    );
    assert_ne!(
        keys.lock_id("user-1", "key-1"),
        keys.lock_id("user-1", "key-2")
    );
    assert_ne!(
        keys.lock_id("user-1", "key-1"),
        keys.lock_id("user-2", "key-1")
    );
    // The separator keeps (scope, key) pairs apart (a scope holds no newline).
    assert_ne!(keys.lock_id("ab", "c"), keys.lock_id("a", "bc"));
}

/// FNV-1a 64 of `"public"."idempotency_keys"`, then of `user-1\nkey-1` (checked with Python).
const PINNED: i64 = 1_695_926_962_846_104_108;
