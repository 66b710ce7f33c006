//! How the store's statements ([`Sql`]) are sent on a tokio-postgres connection: prepared once
//! per connection, or unnamed with their parameter types (behind a transaction pooler).

use crate::schema::{ParamType, Sql};
use deadpool_postgres::ClientWrapper as Client;
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

/// tokio-postgres' type for a parameter type.
fn pg_type(t: ParamType) -> Type {
    match t {
        ParamType::Text => Type::TEXT,
        ParamType::Bytea => Type::BYTEA,
        ParamType::Uuid => Type::UUID,
        ParamType::Int4 => Type::INT4,
        ParamType::Int8 => Type::INT8,
        ParamType::Float8 => Type::FLOAT8,
    }
}

impl Sql {
    /// Makes the statement ready to send on `client`: prepared there once and cached
    /// (`prepared`), or to be sent unnamed with its parameter types, which survives a pooler that
    /// moves the session to another server connection between transactions.
    pub(crate) async fn ready(
        &self,
        client: &Client,
        prepared: bool,
    ) -> Result<Ready<'_>, tokio_postgres::Error> {
        Ok(if prepared {
            Ready::Prepared(client.prepare_cached(&self.text).await?)
        } else {
            Ready::Unnamed(std::borrow::Cow::Borrowed(self))
        })
    }

    /// Runs the statement in one round trip (after a one-time prepare per connection).
    pub(crate) async fn query(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
        prepared: bool,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        self.ready(client, prepared)
            .await?
            .query(client, params)
            .await
    }

    /// Like [`Sql::query`], returning the number of rows changed.
    pub(crate) async fn execute(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
        prepared: bool,
    ) -> Result<u64, tokio_postgres::Error> {
        self.ready(client, prepared)
            .await?
            .execute(client, params)
            .await
    }

    fn typed<'a>(&self, params: &[&'a (dyn ToSql + Sync)]) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
        params
            .iter()
            .copied()
            .zip(self.types.iter().map(|t| pg_type(*t)))
            .collect()
    }
}

/// A statement ready to send: its whole request goes out when the future of
/// [`Ready::query`] is first polled, so futures polled in order (`tokio::join!`) are pipelined
/// in that order, one round trip for all of them.
pub(crate) enum Ready<'a> {
    Prepared(tokio_postgres::Statement),
    Unnamed(std::borrow::Cow<'a, Sql>),
}

impl Ready<'_> {
    /// The same, owning what it sends (for a task of its own).
    pub(crate) fn into_owned(self) -> Ready<'static> {
        match self {
            Ready::Prepared(statement) => Ready::Prepared(statement),
            Ready::Unnamed(sql) => Ready::Unnamed(std::borrow::Cow::Owned(sql.into_owned())),
        }
    }

    /// Sends the statement with `params`; the number of rows it wrote (or returned, unread).
    pub(crate) async fn execute(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        match self {
            Ready::Prepared(statement) => client.execute(statement, params).await,
            Ready::Unnamed(sql) => client.execute_typed(&sql.text, &sql.typed(params)).await,
        }
    }

    /// Sends the statement with `params` and reads its rows.
    pub(crate) async fn query(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self {
            Ready::Prepared(statement) => client.query(statement, params).await,
            Ready::Unnamed(sql) => client.query_typed(&sql.text, &sql.typed(params)).await,
        }
    }
}
