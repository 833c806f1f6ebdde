//! The Lua scripts of the Redis ledger, each with what it returns and the
//! keys and arguments it takes. A script runs whole on one server, so each
//! is one step no other replica can interleave with; on a cluster each
//! touches keys of one hash slot only (the module documentation of
//! `redis/mod.rs` says how the keys are tagged for that).

use std::sync::LazyLock;

use redis::Script;

/// `begin`: done → 2; lease taken now → 0; another holder's lease → 1;
/// the generation mark gone (the keys were lost) → 3, looked at only when
/// its key is given (one server: a cluster's script cannot reach the mark's
/// slot). KEYS: done, lease, and the mark or nothing. ARGV: lease ms.
pub(super) static BEGIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 0 then return 3 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 2 end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then return 0 end
return 1
",
    )
});

/// Whether a state `new` is not older than `old`: their first 12 bytes are
/// the version, big-endian, compared byte by byte (Lua's `<` on strings
/// follows the server's locale).
macro_rules! not_older_lua {
    () => {
        r"
local function not_older(new, old)
  for i = 1, 12 do
    local a, b = string.byte(new, i), string.byte(old, i)
    if a ~= b then return a > b end
  end
  return true
end
local function set_state(key, new)
  local current = redis.call('GET', key)
  if (not current) or not_older(new, current) then
    redis.call('SET', key, new)
  end
end
"
    };
}

/// A commit's entity state, written only if not older. KEYS: the state.
/// ARGV: the new state.
pub(super) static SET_STATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        not_older_lua!(),
        r"
set_state(KEYS[1], ARGV[1])
return 1
"
    ))
});

/// A commit's last write: the delivery is done, with what it was answered
/// (`Answered::to_bytes`; earlier versions wrote `1`), and its lease ends.
/// KEYS: done, lease (one slot). ARGV: done TTL s, the answer, and `keep`
/// to keep an answer already held (a fill's, read back from a record).
pub(super) static MARK_DONE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if ARGV[3] == 'keep' then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[1], 'NX')
else
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[1])
end
redis.call('DEL', KEYS[2])
return 1
",
    )
});

/// A whole commit on one server, where a script may touch keys of any slot:
/// the three writes of a cluster's commit, in the same order, in one round
/// trip. KEYS: entity state, checkpoint, done, lease. ARGV: the new state,
/// the checkpoint, the done TTL in seconds, the delivery's answer (an empty
/// one is not written: a state is never empty), and `keep` to keep an
/// answer already held.
pub(super) static COMMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        not_older_lua!(),
        r"
if ARGV[1] ~= '' then set_state(KEYS[1], ARGV[1]) end
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2]) end
if ARGV[3] ~= '' then
  if ARGV[5] == 'keep' then
    redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[3], 'NX')
  else
    redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[3])
  end
  redis.call('DEL', KEYS[4])
end
return 1
"
    ))
});

/// A lock found held, in the scripts that try one (`LOCK_AND_READ`,
/// `TAKE`): `{0, nil, the lease left in ms (PTTL), 1 when the holder will
/// publish its release to this waiter}`. A holder whose token starts with
/// `w` publishes its release (`UNLOCK`) if the lock is marked waited for:
/// so its waiting key, when given, is set to lapse with the lock's lease
/// (a whole lease for a lock whose PTTL says none). An older version's holder
/// (a token of hex digits) publishes nothing, and is not waited for so.
macro_rules! held_lua {
    () => {
        r"
local function held(lock, waiting, lease)
  local left = redis.call('PTTL', lock)
  local holder = redis.call('GET', lock)
  if waiting and holder and string.sub(holder, 1, 1) == 'w' then
    local mark = left
    if mark < 1 then mark = tonumber(lease) end
    redis.call('SET', waiting, '1', 'PX', mark)
    return {0, false, left, 1}
  end
  return {0, false, left, 0}
end
"
    };
}

/// An entity's lock and, when taken, its state, in one round trip on one
/// server: `{1, state, 0, 0}` when taken (nil for a state not yet written),
/// `{2, nil, 0, 0}` when the generation mark is gone, and what `held` says
/// when another holds it. KEYS: lock, state, the mark, and the lock's
/// waiting key or nothing. ARGV: token, lock lease ms.
pub(super) static LOCK_AND_READ: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        held_lua!(),
        r"
if redis.call('EXISTS', KEYS[3]) == 0 then return {2, false, 0, 0} end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('GET', KEYS[2]), 0, 0}
end
return held(KEYS[1], KEYS[4], ARGV[2])
"
    ))
});

/// A lock, `SET NX PX`: `{1, nil, 0, 0}` when taken, and what `held` says
/// when another holds it. For an entity's on a cluster (its state lies in
/// another slot and is read after) and the rebuild's. KEYS: lock, and its
/// waiting key or nothing. ARGV: token, lease ms.
pub(super) static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        held_lua!(),
        r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, false, 0, 0}
end
return held(KEYS[1], KEYS[2], ARGV[2])
"
    ))
});

/// An entity's lock handed over inside this process, its lease renewed,
/// and its state, in one round trip on one server: `{1, state}` when the
/// lock still holds the token, `{0, nil}` when it lapsed, `{2, nil}` when
/// the generation mark is gone (looked at only when its key is given).
/// KEYS: lock, state, and the mark or nothing. ARGV: token, lock lease ms.
pub(super) static RENEW_AND_READ: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 0 then return {2, false} end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('GET', KEYS[2])}
end
return {0, false}
",
    )
});

/// Releases a lock only if it still holds our token (→ 1, else 0), and
/// publishes the lock's key if a waiter marked it waited for (`held`), the
/// mark deleted with it: a release nobody waits for sends nothing. A
/// refused `PUBLISH` (an ACL without the channel) does not undo the
/// release: a waiter whose subscription is refused too tries every 5 ms,
/// and another wakes at the end of the lease. KEYS: lock, and its
/// waiting key or nothing. ARGV: token, the channel.
pub(super) static UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if KEYS[2] and redis.call('DEL', KEYS[2]) == 1 then
  redis.pcall('PUBLISH', ARGV[2], KEYS[1])
end
return 1
",
    )
});

/// Extends a lock's lease only if it still holds our token.
pub(super) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
",
    )
});

/// A replica's checkpoint: its offsets, stamped with the server's time, in
/// the hash of every replica's (one field each); the entries of replicas
/// that wrote none for `gone after` ms are dropped (they stopped); the
/// topics seen, when given. Written only on a server whose `run_id` and
/// `master_replid` are among those given (none given: not looked at): an
/// offset written on another server than the one the states below it were
/// committed to would be a lie; → 0 then, 1 when written. KEYS: the offsets
/// hash, the topics key (one slot). ARGV: the replica's id, its offsets,
/// gone after ms, the topics or nothing, the run ids and the replication
/// ids expected (each space-separated, or nothing).
pub(super) static CHECKPOINT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if ARGV[5] ~= '' then
  local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or '?'
  local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or '?'
  if not string.find(' ' .. ARGV[5] .. ' ', ' ' .. run_id .. ' ', 1, true)
    or not string.find(' ' .. ARGV[6] .. ' ', ' ' .. replid .. ' ', 1, true) then
    return 0
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now) .. ' ' .. ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local at = tonumber(string.match(all[i + 1], '^(%d+) '))
  if (not at) or at < now - tonumber(ARGV[3]) then redis.call('HDEL', KEYS[1], all[i]) end
end
if ARGV[4] ~= '' then redis.call('SET', KEYS[2], ARGV[4]) end
return 1
",
    )
});
