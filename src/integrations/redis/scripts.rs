//! The store's side: key names, the Lua scripts that make each change one atomic step, and
//! what their replies mean.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{RedisError, Script};

use crate::registry::{Begun, OperationId, OperationState, RegistryError};

/// Key names under a prefix: `{prefix}op:{id}` per operation, `{prefix}cancels` for the
/// announcements.
#[derive(Clone, Debug)]
pub(super) struct Keys {
    prefix: String,
    channel: String,
}

/// The longest key prefix, in bytes.
pub(super) const MAX_PREFIX_LEN: usize = 64;

impl Keys {
    pub(super) fn new(prefix: &str) -> Result<Keys, RegistryError> {
        if prefix.len() > MAX_PREFIX_LEN || !prefix.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(RegistryError::invalid(
                "a key prefix must be at most 64 printable ASCII characters without spaces",
            ));
        }
        Ok(Keys {
            prefix: prefix.to_owned(),
            channel: format!("{prefix}cancels"),
        })
    }

    pub(super) fn operation(&self, id: &OperationId) -> String {
        format!("{}op:{}", self.prefix, id.as_str())
    }

    pub(super) fn channel(&self) -> &str {
        &self.channel
    }
}

/// Creates the entry if absent (`gen` 0, open, `PX` the budget) and returns
/// `{created, pttl, gen, closed}`.
const BEGIN: &str = r"
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then
  redis.call('HSET', KEYS[1], 'gen', 0, 'closed', 0)
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return {1, tonumber(ARGV[1]), 0, 0}
end
local v = redis.call('HMGET', KEYS[1], 'gen', 'closed')
return {0, ttl, tonumber(v[1]) or -1, tonumber(v[2]) or -1}
";

/// Returns `{0}` if absent, else `{1, pttl, gen, closed}`.
const GET: &str = r"
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then return {0} end
local v = redis.call('HMGET', KEYS[1], 'gen', 'closed')
return {1, ttl, tonumber(v[1]) or -1, tonumber(v[2]) or -1}
";

/// If present: bumps `gen` and sets `closed` unless closed already (the key keeps its
/// expiry), announces `{gen} {pttl} {id}` on the channel if asked (again for a second cancel:
/// a repeat is harmless, and it helps a listener that missed the first), and returns
/// `{1, pttl, gen, was_closed}`; `{0}` if absent.
const CANCEL: &str = r"
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then return {0} end
local v = redis.call('HMGET', KEYS[1], 'gen', 'closed')
local gen = tonumber(v[1])
local was = tonumber(v[2])
if gen == nil or was == nil then
  return redis.error_reply('cancel-scope: not an operation entry')
end
if was == 0 then
  gen = redis.call('HINCRBY', KEYS[1], 'gen', 1)
  redis.call('HSET', KEYS[1], 'closed', 1)
end
if ARGV[1] == '1' then
  redis.call('PUBLISH', ARGV[2], gen .. ' ' .. ttl .. ' ' .. ARGV[3])
end
return {1, ttl, gen, was}
";

/// The three scripts, hashed once (sent by `EVALSHA`, loaded on the first `NOSCRIPT`).
#[derive(Debug)]
pub(super) struct Scripts {
    begin: Script,
    get: Script,
    cancel: Script,
    /// The connection's response timeout, for the errors of replies that did not come.
    response_timeout: Duration,
}

impl Scripts {
    pub(super) fn new(response_timeout: Duration) -> Scripts {
        Scripts {
            begin: Script::new(BEGIN),
            get: Script::new(GET),
            cancel: Script::new(CANCEL),
            response_timeout,
        }
    }

    fn fault(&self, e: RedisError) -> RegistryError {
        fault(e, self.response_timeout)
    }

    pub(super) async fn begin(
        &self,
        conn: &mut ConnectionManager,
        key: &str,
        ttl_ms: u64,
    ) -> Result<Begun, RegistryError> {
        let reply: Vec<i64> = self
            .begin
            .key(key)
            .arg(ttl_ms)
            .invoke_async(conn)
            .await
            .map_err(|e| self.fault(e))?;
        let (created, state) = match reply.as_slice() {
            [created, rest @ ..] => (*created == 1, state(rest)?),
            [] => return Err(unexpected()),
        };
        Ok(Begun::new(state, created))
    }

    pub(super) async fn get(
        &self,
        conn: &mut ConnectionManager,
        key: &str,
    ) -> Result<Option<OperationState>, RegistryError> {
        let reply: Vec<i64> = self
            .get
            .key(key)
            .invoke_async(conn)
            .await
            .map_err(|e| self.fault(e))?;
        match reply.as_slice() {
            [0] => Ok(None),
            [1, rest @ ..] => state(rest).map(Some),
            _ => Err(unexpected()),
        }
    }

    /// `Some((state, was_cancelled))`, or `None` if absent.
    pub(super) async fn cancel(
        &self,
        conn: &mut ConnectionManager,
        keys: &Keys,
        id: &OperationId,
        announce: bool,
    ) -> Result<Option<(OperationState, bool)>, RegistryError> {
        let reply: Vec<i64> = self
            .cancel
            .key(keys.operation(id))
            .arg(if announce { "1" } else { "0" })
            .arg(keys.channel())
            .arg(id.as_str())
            .invoke_async(conn)
            .await
            .map_err(|e| self.fault(e))?;
        match reply.as_slice() {
            [0] => Ok(None),
            [1, ttl, generation, was] => {
                let state = state(&[*ttl, *generation, 1])?;
                Ok(Some((state, *was == 1)))
            }
            _ => Err(unexpected()),
        }
    }
}

/// `{pttl, gen, closed}` as a state; anything this crate did not write (a key without an
/// expiry, missing fields) is a store error.
fn state(reply: &[i64]) -> Result<OperationState, RegistryError> {
    match *reply {
        [ttl, generation, closed]
            if ttl >= 0 && generation >= 0 && (closed == 0 || closed == 1) =>
        {
            Ok(OperationState::new(
                Duration::from_millis(ttl.unsigned_abs()),
                generation.unsigned_abs(),
                closed == 1,
            ))
        }
        _ => Err(unexpected()),
    }
}

fn unexpected() -> RegistryError {
    RegistryError::store("the key holds something that is not an operation entry of this registry")
}

/// What a Redis error means for the caller (`after`: the timeout a reply did not come
/// within).
pub(super) fn fault(e: RedisError, after: Duration) -> RegistryError {
    if e.is_timeout() {
        RegistryError::timeout(after)
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
    {
        RegistryError::unreachable(e)
    } else {
        RegistryError::store(e)
    }
}

/// A cancel announcement: `{gen} {pttl} {id}` (the id last: it may contain spaces).
pub(super) fn parse_announcement(payload: &[u8]) -> Option<(u64, Duration, OperationId)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (generation, rest) = text.split_once(' ')?;
    let (ttl, id) = rest.split_once(' ')?;
    let generation = generation.parse().ok()?;
    let ttl = Duration::from_millis(ttl.parse().ok()?);
    Some((generation, ttl, OperationId::new(id).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_parse_strictly() {
        let (g, ttl, id) = parse_announcement(b"3 1500 op with spaces").unwrap();
        assert_eq!(
            (g, ttl, id.as_str()),
            (3, Duration::from_millis(1500), "op with spaces")
        );
        for bad in [
            &b""[..],
            b"x 1 op",
            b"1 -5 op",
            b"1 5",
            b"1 5 ",
            b"1 5 \x01",
            b"\xff 1 op",
        ] {
            assert!(parse_announcement(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn prefixes_are_validated() {
        assert!(Keys::new("app:").is_ok());
        assert!(Keys::new("").is_ok());
        assert!(Keys::new("a b").unwrap_err().is_invalid());
        assert!(Keys::new(&"p".repeat(MAX_PREFIX_LEN + 1)).is_err());
        let keys = Keys::new("app:").unwrap();
        assert_eq!(
            keys.operation(&OperationId::new("o-1").unwrap()),
            "app:op:o-1"
        );
        assert_eq!(keys.channel(), "app:cancels");
    }
}
