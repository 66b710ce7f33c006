#![doc = include_str!("../README.md")]
//!
//! # Which answers are retried
//! [`classify`] is the rule, for any server that follows the IETF draft or Stripe
//! ([`Profile`]): the middleware sends the request again, with the same key, only when no answer
//! came or the answer is the key's own "not now" (a duplicate in flight, the store unavailable,
//! the outcome not known yet, too many requests, a proxy's `502`/`504`), never a replay and never
//! the handler's own answer.

mod error;
mod middleware;
mod policy;

pub use error::ClientError;
pub use middleware::{Attempts, IdempotentRetry, IdempotentRetryBuilder};
pub use policy::{
    IDEMPOTENCY_REFUSAL, IDEMPOTENT_REPLAYED, Profile, STRIPE_SHOULD_RETRY, Verdict, classify,
    retry_after,
};
