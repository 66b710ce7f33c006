//! The tokio-postgres driver's listening session: a connection of its own, made with the
//! store's settings (TLS included), which the pool never hands out.

use super::driver_error::driver_error;
use super::tls::Connector;
use crate::driver::DriverError;
use crate::error::BACKEND;
use idempotency_core::StoreError;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;
use tokio_postgres::tls::TlsStream;
use tokio_postgres::{AsyncMessage, Client, Connection};
use tokio_util::sync::CancellationToken;

/// What a listening session is made with: the settings the store's pool connects with.
pub(crate) struct ListenTarget {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) connector: Connector,
}

impl ListenTarget {
    /// Connects, sends `LISTEN channel`, and returns once it is in force; the session then
    /// runs in a task of its own (see [`DriverOps::listen`](crate::driver::DriverOps::listen)).
    pub(crate) async fn listen(
        &self,
        channel: &str,
        notices: UnboundedSender<String>,
        stop: CancellationToken,
    ) -> Result<(), DriverError> {
        match &self.connector {
            Connector::Plain(tls) => {
                let (client, connection) = self.config.connect(*tls).await.map_err(driver_error)?;
                run(client, connection, channel, notices, stop).await
            }
            #[cfg(feature = "tls")]
            Connector::Rustls(tls) => {
                let (client, connection) = self
                    .config
                    .connect(tls.clone())
                    .await
                    .map_err(driver_error)?;
                run(client, connection, channel, notices, stop).await
            }
        }
    }
}

/// Drives `connection` in a task (a tokio-postgres connection hands out notices only to
/// whoever polls it), sends `LISTEN` on `client`, and answers once the server confirmed it.
async fn run<S, T>(
    client: Client,
    mut connection: Connection<S, T>,
    channel: &str,
    notices: UnboundedSender<String>,
    stop: CancellationToken,
) -> Result<(), DriverError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: TlsStream + Unpin + Send + 'static,
{
    let (listening, listened) = oneshot::channel::<Result<(), DriverError>>();
    let sql = format!("LISTEN {channel}");
    tokio::spawn(async move {
        let listen = client.batch_execute(&sql);
        tokio::pin!(listen);
        let mut listening = Some(listening);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                result = &mut listen, if listening.is_some() => {
                    let failed = result.is_err();
                    if let Some(listening) = listening.take() {
                        let _ = listening.send(result.map_err(driver_error));
                    }
                    if failed {
                        break;
                    }
                }
                message = std::future::poll_fn(|cx| connection.poll_message(cx)) => match message {
                    Some(Ok(AsyncMessage::Notification(notice))) => {
                        if notices.send(notice.payload().to_owned()).is_err() {
                            break;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        tracing::debug!(error = %error, "the store's listening session ended");
                        break;
                    }
                    None => break,
                },
            }
        }
        // Dropped here: `client` (closing the session), then `notices` (telling the store).
    });
    match listened.await {
        Ok(result) => result,
        Err(_) => Err(DriverError {
            sqlstate: None,
            error: StoreError::Unavailable {
                backend: BACKEND,
                source: "the listening session ended before LISTEN was confirmed".into(),
            },
        }),
    }
}
