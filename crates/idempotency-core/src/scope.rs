//! The scope: whose key this is.

use std::fmt;

/// Longest scope accepted, in bytes.
pub const MAX_SCOPE_LEN: usize = 512;

/// The principal a key belongs to (the ADR's `user_id`), part of every record's address.
///
/// Two callers that send the same key never see each other's records because each record is
/// addressed by `(scope, key)`, never by the key alone (ADR amendment 1). A scope is usually the
/// authenticated user or tenant id; it is compared byte for byte.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(Box<str>);

/// Why a scope was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The scope is empty: an empty principal would merge every anonymous caller into one scope.
    #[error("the scope is empty")]
    Empty,
    /// The scope is longer than [`MAX_SCOPE_LEN`] bytes.
    #[error("the scope is {len} bytes long; at most {MAX_SCOPE_LEN} are allowed")]
    TooLong {
        /// Length received, in bytes.
        len: usize,
    },
    /// The scope contains a control character (which includes NUL, which PostgreSQL `text`
    /// cannot hold).
    #[error("the scope contains a control character at byte {position}")]
    ControlCharacter {
        /// Byte offset of the first offending character.
        position: usize,
    },
}

impl Scope {
    /// The one scope used by a layer built with `unscoped()`: every caller shares one key space.
    /// It starts with a control character, which [`Scope::new`] refuses, so no caller's own scope
    /// can ever equal it.
    ///
    /// Dangerous where callers are not one trusted party: a caller that learns or guesses another
    /// caller's key is served that caller's stored response.
    pub const UNSCOPED: &'static str = "\u{1}unscoped";

    /// Validates a scope: 1 to [`MAX_SCOPE_LEN`] bytes, no control characters.
    pub fn new(value: impl Into<String>) -> Result<Self, ScopeError> {
        let value: String = value.into();
        if value.is_empty() {
            return Err(ScopeError::Empty);
        }
        if value.len() > MAX_SCOPE_LEN {
            return Err(ScopeError::TooLong { len: value.len() });
        }
        if let Some((position, _)) = value.char_indices().find(|(_, c)| c.is_control()) {
            return Err(ScopeError::ControlCharacter { position });
        }
        Ok(Scope(value.into_boxed_str()))
    }

    /// The scope shared by every caller of an unscoped layer; see [`Scope::UNSCOPED`].
    pub fn unscoped() -> Self {
        Scope(Box::from(Self::UNSCOPED))
    }

    /// The scope's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Scope").field(&&*self.0).finish()
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for Scope {
    type Error = ScopeError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Scope::new(value)
    }
}

impl TryFrom<String> for Scope {
    type Error = ScopeError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Scope::new(value)
    }
}

impl From<uuid::Uuid> for Scope {
    fn from(value: uuid::Uuid) -> Self {
        let mut buf = uuid::Uuid::encode_buffer();
        Scope(Box::from(&*value.hyphenated().encode_lower(&mut buf)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_scopes() {
        assert_eq!(Scope::new(""), Err(ScopeError::Empty));
        assert_eq!(
            Scope::new("a\0b"),
            Err(ScopeError::ControlCharacter { position: 1 })
        );
        assert_eq!(
            Scope::new("x".repeat(513)),
            Err(ScopeError::TooLong { len: 513 })
        );
        let odd = r#"user "{1}" \ ' ; DROP TABLE x; --"#;
        assert_eq!(Scope::new(odd).unwrap().as_str(), odd);
        assert_eq!(Scope::new("ユーザー").unwrap().as_str(), "ユーザー");
    }

    #[test]
    fn no_caller_scope_can_equal_the_unscoped_one() {
        assert!(Scope::new(Scope::UNSCOPED).is_err());
        assert_eq!(Scope::unscoped().as_str(), Scope::UNSCOPED);
    }

    #[test]
    fn uuid_scope_is_lower_case_hyphenated() {
        let id = uuid::Uuid::parse_str("8E03978E-40D5-43E8-BC93-6894A57F9324").unwrap();
        assert_eq!(
            Scope::from(id).as_str(),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
    }
}
