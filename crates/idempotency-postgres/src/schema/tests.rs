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
