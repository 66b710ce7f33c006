//! Bodies: reading the request with a limit, and keeping the response while sending it.

use bytes::{Bytes, BytesMut};
use futures_util::{StreamExt, stream};
use http_body::{Body, Frame};
use http_body_util::{
    BodyExt, BodyStream, Full, LengthLimitError, StreamBody, combinators::UnsyncBoxBody,
};

pub use idempotency_core::BoxError;

/// The body of every response the layer returns: the handler's (passed through or re-sent),
/// a replay, or a problem.
pub type IdempotencyBody = UnsyncBoxBody<Bytes, BoxError>;

pub(crate) fn full(bytes: Bytes) -> IdempotencyBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub(crate) fn boxed<B>(body: B) -> IdempotencyBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// The body of a request the layer hands to the inner service: the bytes it read, for a request
/// it covers, or the original body, for one it passes through. Any request body type goes in
/// (hyper's `Incoming`, axum's `Body`, ...); the inner service takes this one (axum's routes take
/// any body).
#[derive(Debug)]
pub struct RequestBody(RequestBodyInner);

enum RequestBodyInner {
    Read(Full<Bytes>),
    Passed(UnsyncBoxBody<Bytes, BoxError>),
}

impl std::fmt::Debug for RequestBodyInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestBodyInner::Read(_) => f.write_str("Read"),
            RequestBodyInner::Passed(_) => f.write_str("Passed"),
        }
    }
}

impl RequestBody {
    /// A body of `bytes`, already read.
    pub fn from_bytes(bytes: Bytes) -> Self {
        RequestBody(RequestBodyInner::Read(Full::new(bytes)))
    }

    /// Any body, passed on as it streams.
    pub fn new<B>(body: B) -> Self
    where
        B: Body + Send + 'static,
        B::Error: Into<BoxError>,
    {
        use bytes::Buf;
        let body = body
            .map_frame(|frame| frame.map_data(|mut data| data.copy_to_bytes(data.remaining())))
            .map_err(Into::into)
            .boxed_unsync();
        RequestBody(RequestBodyInner::Passed(body))
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.0 {
            RequestBodyInner::Read(full) => std::pin::Pin::new(full)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            RequestBodyInner::Passed(body) => std::pin::Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            RequestBodyInner::Read(full) => full.is_end_stream(),
            RequestBodyInner::Passed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.0 {
            RequestBodyInner::Read(full) => full.size_hint(),
            RequestBodyInner::Passed(body) => body.size_hint(),
        }
    }
}

/// The bytes of request bodies the layer may hold at once, across every request it serves: a
/// thousand stalled uploads would otherwise pin a thousand times the body limit.
#[derive(Clone)]
pub(crate) struct BodyBudget(Option<std::sync::Arc<tokio::sync::Semaphore>>);

impl std::fmt::Debug for BodyBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let free = self.0.as_ref().map(|s| s.available_permits());
        f.debug_struct("BodyBudget").field("free", &free).finish()
    }
}

/// A request's share of the [`BodyBudget`], given back when dropped.
pub(crate) struct BodyPermit(#[allow(dead_code)] Option<tokio::sync::OwnedSemaphorePermit>);

impl BodyBudget {
    /// A budget of `bytes` (`usize::MAX`: none).
    pub(crate) fn new(bytes: usize) -> Self {
        let max = tokio::sync::Semaphore::MAX_PERMITS;
        BodyBudget((bytes < max).then(|| std::sync::Arc::new(tokio::sync::Semaphore::new(bytes))))
    }

    /// Takes `bytes` more for `permit`, or says the budget is spent (never waits: a request
    /// refused at once is cheaper than one more held connection).
    fn take(&self, permit: &mut BodyPermit, bytes: usize) -> Result<(), ReadError> {
        let Some(budget) = &self.0 else {
            return Ok(());
        };
        let wanted = u32::try_from(bytes).map_err(|_| ReadError::Busy)?;
        let more = std::sync::Arc::clone(budget)
            .try_acquire_many_owned(wanted)
            .map_err(|_| ReadError::Busy)?;
        match &mut permit.0 {
            Some(held) => held.merge(more),
            None => permit.0 = Some(more),
        }
        Ok(())
    }
}

/// Why a request body was not read.
pub(crate) enum ReadError {
    /// Longer than the limit: ours, or one an outer layer (axum's `DefaultBodyLimit`,
    /// tower-http's `RequestBodyLimit`) put on the body.
    TooLarge,
    /// The body failed or ended early.
    Unreadable,
    /// The bodies being held already take the layer's whole budget.
    Busy,
}

/// Reads a request body of at most `limit` bytes, taking its bytes from `budget` as they
/// arrive (the permit returned holds them). A body that arrives in one frame (the common case:
/// hyper hands a small body over in one piece) is returned as that frame's bytes, with no
/// buffer list and no copy.
pub(crate) async fn read_body<B>(
    body: B,
    limit: usize,
    budget: &BodyBudget,
) -> Result<(Bytes, BodyPermit), ReadError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    use bytes::Buf;
    let mut permit = BodyPermit(None);
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut more: Option<BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| classify(e.into()))?;
        // Trailers carry no body bytes.
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        len = len.saturating_add(data.remaining());
        if len > limit {
            return Err(ReadError::TooLarge);
        }
        budget.take(&mut permit, data.remaining())?;
        let data = data.copy_to_bytes(data.remaining());
        match (&mut first, &mut more) {
            (None, _) => first = Some(data),
            (Some(head), None) => {
                let mut buf = BytesMut::with_capacity(len);
                buf.extend_from_slice(head);
                buf.extend_from_slice(&data);
                more = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&data),
        }
    }
    let bytes = match (first, more) {
        (_, Some(buf)) => buf.freeze(),
        (Some(head), None) => head,
        (None, None) => Bytes::new(),
    };
    Ok((bytes, permit))
}

/// Whether a body error means "too large" (a limit an outer layer put on the body) or anything
/// else.
fn classify(error: BoxError) -> ReadError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*error);
    while let Some(e) = cause {
        if e.is::<LengthLimitError>() {
            return ReadError::TooLarge;
        }
        cause = e.source();
    }
    ReadError::Unreadable
}

/// A response body read up to a cap.
pub(crate) enum Kept {
    /// The whole body, within the cap.
    Whole(Bytes),
    /// The body was over the cap: what was read, and the body to send after it.
    Over(IdempotencyBody),
}

/// Reads a response body up to `cap` bytes. Past the cap it stops reading and returns a body
/// that sends what was read followed by the rest, so the client still gets every byte.
pub(crate) async fn keep_up_to<B>(body: B, cap: usize) -> Result<Kept, BoxError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    // Most bodies are one frame: keep it aside, and list frames only from the second on.
    let mut first: Option<Bytes> = None;
    let mut more: Vec<Bytes> = Vec::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Into::into)?;
        match frame.into_data() {
            Ok(data) => {
                len += data.len();
                if first.is_none() {
                    first = Some(data);
                } else {
                    more.push(data);
                }
                if len > cap {
                    let read = first.into_iter().chain(more).map(|c| Ok(Frame::data(c)));
                    let rest = BodyStream::new(body.map_err(Into::into));
                    return Ok(Kept::Over(
                        StreamBody::new(stream::iter(read).chain(rest)).boxed_unsync(),
                    ));
                }
            }
            // Trailers are not replayed.
            Err(_trailers) => {}
        }
    }
    Ok(Kept::Whole(match first {
        None => Bytes::new(),
        Some(only) if more.is_empty() => only,
        Some(head) => {
            let mut buf = BytesMut::with_capacity(len);
            buf.extend_from_slice(&head);
            for c in more {
                buf.extend_from_slice(&c);
            }
            buf.freeze()
        }
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http::HeaderMap;

    /// A body of these frames: data, then trailers if asked.
    fn frames(parts: &[&'static str], trailers: bool) -> IdempotencyBody {
        let mut frames: Vec<Result<Frame<Bytes>, BoxError>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        if trailers {
            frames.push(Ok(Frame::trailers(HeaderMap::new())));
        }
        StreamBody::new(stream::iter(frames)).boxed_unsync()
    }

    async fn all_of(body: IdempotencyBody) -> Bytes {
        body.collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_request_body_is_read_whole_in_one_frame_or_many() {
        for (parts, trailers) in [
            (&[][..], false),
            (&["abc"][..], false),
            (&["ab", "", "cd", "e"][..], true),
        ] {
            let read = read_body(frames(parts, trailers), 5, &BodyBudget::new(usize::MAX)).await;
            assert_eq!(read.ok().unwrap().0, parts.concat().as_bytes());
        }
    }

    #[tokio::test]
    async fn a_request_body_over_the_limit_is_too_large_in_one_frame_or_many() {
        for parts in [
            &["abcdef"][..],
            &["abc", "def"][..],
            &["ab", "cd", "ef"][..],
        ] {
            assert!(matches!(
                read_body(frames(parts, false), 5, &BodyBudget::new(usize::MAX)).await,
                Err(ReadError::TooLarge)
            ));
        }
    }

    /// Issue 28 item 3: bodies held at once are bounded across requests; a body that would
    /// pass the budget is refused at once, and a finished request gives its bytes back.
    #[tokio::test]
    async fn bodies_held_at_once_are_bounded_by_the_budget() {
        let budget = BodyBudget::new(8);
        let (first, held) = read_body(frames(&["abc", "de"], false), 100, &budget)
            .await
            .ok()
            .unwrap();
        assert_eq!(first, "abcde");
        assert!(matches!(
            read_body(frames(&["ab", "cd"], false), 100, &budget).await,
            Err(ReadError::Busy)
        ));
        // A refused read gave back what it had taken: 3 bytes are still free.
        assert!(
            read_body(frames(&["abc"], false), 100, &budget)
                .await
                .is_ok()
        );
        drop(held);
        assert!(
            read_body(frames(&["abcdefgh"], false), 100, &budget)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_response_body_within_the_cap_is_kept_whole_and_one_over_it_is_sent_whole() {
        for parts in [&[][..], &["abc"][..], &["ab", "c", "de"][..]] {
            let Kept::Whole(kept) = keep_up_to(frames(parts, true), 5).await.unwrap() else {
                panic!("{parts:?} is within the cap");
            };
            assert_eq!(kept, parts.concat().as_bytes());
        }
        for parts in [&["abcdef"][..], &["ab", "cd", "ef", "gh"][..]] {
            let Kept::Over(body) = keep_up_to(frames(parts, false), 5).await.unwrap() else {
                panic!("{parts:?} is over the cap");
            };
            assert_eq!(all_of(body).await, parts.concat().as_bytes());
        }
    }
}
