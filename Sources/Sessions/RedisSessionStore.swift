import NIOConcurrencyHelpers
import NIOCore
import Redis

/// Sessions in Redis, in the data model of DESIGN §3. Key names (with the default prefix):
///
/// - `sg:session:{sub}:<hash>` hash — the session, in its user's slot; expires with it (idle, capped
///   by absolute timeout). A session from before cookies carried the user: `sg:session:{hash}`
/// - `sg:user:{sub}` hash — the profile; `sg:user:{sub}:sessions` set — the user's sessions
///   (`u:<hash>` for a session in the user's slot, the bare hash for one from before)
/// - `sg:revoked:{sub}` string — `revoked_at` (Unix ms); expires after the absolute session timeout
/// - `sg:user:{sub}:tokens` hash — the user's latest refresh token per client id (sealed)
/// - `sg:outbox` hash — jobs that must be done at least once (revocations at Apple, events)
/// - `sg:nonce:{hash}` string — an issued native nonce's client id; 10 minutes, taken once (GETDEL)
/// - `sg:link:{sub}` string — the legacy account linked to the user; `sg:account:{id}` the reverse
///   (in the account's slot: written before the link and removed after it, so a reverse key
///   without its link is a leftover that the next `link` of that account takes over)
/// - `sg:login:{state}` hash — a login in progress; 10 minutes, taken atomically (MULTI)
/// - `sg:notification:{jti}` string — a notification already processed (a week)
/// - `sg:transfer:{transfer id}` hash — one user of an app transfer (from, target, data, to, mapped_at); 90 days
///   after its last write (`TransferRecord.lifetime`); the write that maps the user drops `data`
/// - `sg:validation:{token hash}` hash — the fleet's last re-validation result; `sg:lock:validation:{token hash}` its lock
/// - `sg:apple_return_url` string — the Apple return URL the fleet last started with (no expiry)
///
/// The braces are Redis Cluster hash tags. Everything admission reads for a session (the
/// session, its user's profile, revocation marker and link) shares the user's slot: one round
/// trip to one node. Every other key is its own tag; every script declares the keys it touches
/// and they share a slot. Operations spanning users (the user list, transfers) scan every master.
public final class RedisSessionStore: SessionStore {
    let redis: any RedisCommands
    let prefix: String

    public init(client: any RedisCommands, keyPrefix: String = "sg:") {
        self.redis = client
        self.prefix = keyPrefix
    }

    /// In the user's slot when the handle names its user; else (a cookie from before) its own.
    func sessionKey(_ h: SessionHandle) -> String {
        guard let sub = h.sub else { return "\(prefix)session:{\(h.key)}" }
        return "\(prefix)session:{\(sub)}:\(h.key)"
    }

    /// Why a session ended (`end(of:)`): in the session's slot.
    func endedKey(_ h: SessionHandle) -> String {
        guard let sub = h.sub else { return "\(prefix)ended:{\(h.key)}" }
        return "\(prefix)ended:{\(sub)}:\(h.key)"
    }

    /// How `user:{sub}:sessions` names a session.
    static func member(_ h: SessionHandle) -> String { h.sub == nil ? h.key : "u:" + h.key }

    /// The session a member of `sub`'s set names.
    static func handle(member: String, of sub: String) -> SessionHandle? {
        member.hasPrefix("u:") ? SessionHandle(key: String(member.dropFirst(2)), sub: sub) : SessionHandle(key: member)
    }

    /// The sessions `sub`'s set names, each with its member.
    private func members(of sub: String, on loop: any EventLoop) -> EventLoopFuture<[(member: String, handle: SessionHandle)]> {
        send(["SMEMBERS", .string(userSessionsKey(sub))], on: loop).map { reply in
            (reply.arrayValue ?? []).compactMap { $0.string }.compactMap { m in Self.handle(member: m, of: sub).map { (m, $0) } }
        }
    }
    func userKey(_ sub: String) -> String { "\(prefix)user:{\(sub)}" }
    func userSessionsKey(_ sub: String) -> String { "\(prefix)user:{\(sub)}:sessions" }
    func revokedKey(_ sub: String) -> String { "\(prefix)revoked:{\(sub)}" }
    func loginKey(_ state: String) -> String { "\(prefix)login:{\(state)}" }
    func userTokensKey(_ sub: String) -> String { "\(prefix)user:{\(sub)}:tokens" }
    var outboxKey: String { "\(prefix)outbox" }
    func nonceKey(_ hash: String) -> String { "\(prefix)nonce:{\(hash)}" }
    func linkKey(_ sub: String) -> String { "\(prefix)link:{\(sub)}" }
    func accountKey(_ account: String) -> String { "\(prefix)account:{\(account)}" }
    func transferKey(_ id: String) -> String { "\(prefix)transfer:{\(id)}" }

    private func send(_ args: [RedisArgument], on loop: any EventLoop) -> EventLoopFuture<RESPValue> {
        redis.send(args, on: loop).flatMapErrorThrowing { error in
            throw SessionStoreError(error)
        }
    }

    private func eval(_ script: RedisScript, keys: [RedisArgument], arguments: [RedisArgument], on loop: any EventLoop) -> EventLoopFuture<RESPValue> {
        redis.eval(script, keys: keys, arguments: arguments, on: loop).flatMapErrorThrowing { error in
            throw SessionStoreError(error)
        }
    }

    /// Commands in one MULTI/EXEC, written back to back on the loop's connection (callers off
    /// the loop included); the EXEC reply's array.
    private func transaction(_ commands: [[RedisArgument]], on loop: any EventLoop) -> EventLoopFuture<[RESPValue]> {
        redis.sendAll([["MULTI"]] + commands + [["EXEC"]], on: loop).flatMapThrowing { replies in
            guard case .array(let results?) = replies.last else { throw SessionStoreError("transaction aborted") }
            return results
        }.flatMapErrorThrowing { error in
            throw SessionStoreError(error)
        }
    }

    public func create(_ session: SessionRecord, profile: UserProfile, expiresAt: Int64, on loop: any EventLoop) -> EventLoopFuture<Void> {
        var fields: [RedisArgument] = [
            "sub", .string(session.sub), "client_id", .string(session.clientID), "created", RedisArgument(session.created),
            "last_seen", RedisArgument(session.lastSeen), "validated_at", RedisArgument(session.validatedAt),
        ]
        if let token = session.sealedRefreshToken { fields += ["refresh_token", .string(token)] }
        let record: [[RedisArgument]] = [
            ["HSET", .string(sessionKey(session.handle))] + fields,
            ["PEXPIREAT", .string(sessionKey(session.handle)), RedisArgument(expiresAt)],
        ]
        var commands: [[RedisArgument]] = [["SADD", .string(userSessionsKey(session.sub)), .string(Self.member(session.handle))]]
        // The user's hash exists from the first session on, as in memory, even without a field
        // (a user known to the gateway is one whose notifications it applies).
        let profileFields = [("sub", profile.sub)] + profile.fields
        commands.append(["HSET", .string(userKey(profile.sub))] + profileFields.flatMap { [RedisArgument.string($0.0), .string($0.1)] })
        // A user who signs in again is kept (a revocation left the rest to expire).
        commands.append(["PERSIST", .string(userKey(profile.sub))])
        commands.append(["PERSIST", .string(userTokensKey(profile.sub))])
        // In its user's slot: one transaction. A handle without its user (only a session
        // carried over from before names none) is stored in its own slot first.
        let userCommands = commands
        guard session.handle.sub == nil else { return transaction(record + userCommands, on: loop).map { _ in } }
        return transaction(record, on: loop).flatMap { _ in self.transaction(userCommands, on: loop) }.map { _ in }
    }

    /// `account:{id}` for ARGV[1] (the sub): answers the holder when another sub holds it,
    /// else takes it (ARGV[2] = a holder being replaced, "" for none) and answers nil.
    static let claimAccountScript = RedisScript("""
        local holder = redis.call('GET', KEYS[1])
        if holder and holder ~= ARGV[1] and holder ~= ARGV[2] then return holder end
        redis.call('SET', KEYS[1], ARGV[1])
        return false
        """)

    /// Deletes KEYS[1] when it holds ARGV[1].
    static let deleteIfScript = RedisScript("""
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """)

    /// `revoked:{sub}` = max(itself, ARGV[1]), kept ARGV[2] ms.
    static let markerScript = RedisScript("""
        local current = tonumber(redis.call('GET', KEYS[1]) or '')
        if current == nil or tonumber(ARGV[1]) > current then
            redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
        else
            redis.call('PEXPIRE', KEYS[1], ARGV[2])
        end
        return 1
        """)

    /// What admission needs on a cache miss in one round trip to one node: KEYS = the session,
    /// its user's profile, revocation marker and link, all in the user's slot.
    static let loadScript = RedisScript("""
        local s = redis.call('HGETALL', KEYS[1])
        if #s == 0 then return {} end
        return {s, redis.call('HGETALL', KEYS[2]), redis.call('GET', KEYS[3]), redis.call('GET', KEYS[4])}
        """)

    /// Set once Redis refused scripts (an ACL user without `+@scripting`): misses take two
    /// round trips from then on.
    private let scriptsRefused = NIOLockedValueBox(false)

    /// A session from before cookies carried the user is in another slot than its user: two
    /// round trips (until those sessions expire).
    public func load(_ handle: SessionHandle, on loop: any EventLoop) -> EventLoopFuture<StoredSession?> {
        guard let sub = handle.sub, !scriptsRefused.withLockedValue({ $0 }) else { return loadInTwo(handle, on: loop) }
        let keys: [RedisArgument] = [.string(sessionKey(handle)), .string(userKey(sub)), .string(revokedKey(sub)), .string(linkKey(sub))]
        return redis.eval(Self.loadScript, keys: keys, on: loop).flatMap { reply in
            guard let parts = reply.arrayValue else { return loop.makeFailedFuture(SessionStoreError("unexpected reply to the session script")) }
            guard let first = parts.first, let fields = HashReply(first), !fields.isEmpty else { return loop.makeSucceededFuture(nil) }
            guard parts.count == 4, var record = Self.session(handle, fields), record.sub == sub else {
                return loop.makeFailedFuture(SessionStoreError("malformed session record"))
            }
            record.sub = sub  // one copy of the user's id, with the handle's (a cached session holds it)
            return loop.makeSucceededFuture(StoredSession(session: record, user: UserProfile(sub: record.sub, hash: HashReply(parts[1])),
                                                          revokedAt: HashReply.int64(parts[2]), account: parts[3].string))
        }.flatMapError { error in
            if let refused = error as? RedisError, refused.isRefusedCommand {
                self.scriptsRefused.withLockedValue { $0 = true }
                return self.loadInTwo(handle, on: loop)
            }
            return loop.makeFailedFuture(SessionStoreError(error))
        }
    }

    /// `load` without a script: the session, then its user and revocation marker.
    private func loadInTwo(_ handle: SessionHandle, on loop: any EventLoop) -> EventLoopFuture<StoredSession?> {
        send(["HGETALL", .string(sessionKey(handle))], on: loop).flatMap { reply in
            guard let fields = HashReply(reply), !fields.isEmpty else { return loop.makeSucceededFuture(nil) }
            guard let record = Self.session(handle, fields), handle.sub == nil || handle.sub == record.sub else {
                return loop.makeFailedFuture(SessionStoreError("malformed session record"))
            }
            return self.redis.sendAll([["HGETALL", .string(self.userKey(record.sub))], ["GET", .string(self.revokedKey(record.sub))],
                                       ["GET", .string(self.linkKey(record.sub))]], on: loop)
                .flatMapErrorThrowing { throw SessionStoreError($0) }
                .map { replies in
                    StoredSession(session: record, user: UserProfile(sub: record.sub, hash: HashReply(replies[0])),
                                  revokedAt: HashReply.int64(replies[1]), account: replies[2].string)
                }
        }
    }

    public func touch(_ handle: SessionHandle, lastSeen: Int64, expiresAt: Int64, on loop: any EventLoop) -> EventLoopFuture<Void> {
        // HSET on an expired (deleted) session would resurrect a fieldless hash: only when it exists.
        let key = sessionKey(handle)
        return send(["EXISTS", .string(key)], on: loop).flatMap { exists in
            guard exists.int == 1 else { return loop.makeSucceededVoidFuture() }
            let set = self.send(["HSET", .string(key), "last_seen", RedisArgument(lastSeen)], on: loop)
            let expire = self.send(["PEXPIREAT", .string(key), RedisArgument(expiresAt)], on: loop)
            return set.and(expire).map { _ in }
        }
    }

    public func delete(_ handle: SessionHandle, sub: String, end: SessionEnd, keep: Int64, on loop: any EventLoop) -> EventLoopFuture<Void> {
        let ended: [RedisArgument] = ["SET", .string(endedKey(handle)), .string(end.rawValue), "PX", RedisArgument(max(keep, 1))]
        // One slot: atomically. A session from before is in its own slot: ended first, then
        // forgotten by its user (a member left behind is tidied by `sessions(of:)`).
        guard handle.sub == nil else {
            return transaction([["DEL", .string(sessionKey(handle))], ended, ["SREM", .string(userSessionsKey(sub)), .string(Self.member(handle))]], on: loop).map { _ in }
        }
        return transaction([["DEL", .string(sessionKey(handle))], ended], on: loop).flatMap { _ in
            self.send(["SREM", .string(self.userSessionsKey(sub)), .string(Self.member(handle))], on: loop).map { _ in }
        }
    }

    public func end(of handle: SessionHandle, on loop: any EventLoop) -> EventLoopFuture<SessionEnd?> {
        send(["GET", .string(endedKey(handle))], on: loop).map { $0.string.flatMap(SessionEnd.init(rawValue:)) }
    }

    public func sessions(of sub: String, on loop: any EventLoop) -> EventLoopFuture<[SessionRecord]> {
        members(of: sub, on: loop).flatMap { members in
            let loads = members.map { m in self.send(["HGETALL", .string(self.sessionKey(m.handle))], on: loop).map { (m, $0) } }
            return EventLoopFuture.whenAllSucceed(loads, on: loop).flatMap { pairs in
                var live: [SessionRecord] = []
                var gone: [RedisArgument] = []
                for (m, r) in pairs {
                    if let f = HashReply(r), !f.isEmpty, let record = Self.session(m.handle, f) { live.append(record) } else { gone.append(.string(m.member)) }
                }
                let sorted = live.sorted { ($0.created, $0.handle.key) < ($1.created, $1.handle.key) }
                guard !gone.isEmpty else { return loop.makeSucceededFuture(sorted) }
                // Expired sessions leave their hash in the set: tidy up while we are here.
                return self.send(["SREM", .string(self.userSessionsKey(sub))] + gone, on: loop).map { _ in sorted }
            }
        }
    }

    public func revoke(_ sub: String, at revokedAt: Int64, keep: Int64, forget: Forgetting, end: SessionEnd, clients: Set<String>?,
                       on loop: any EventLoop) -> EventLoopFuture<Revocation> {
        members(of: sub, on: loop).flatMap { members in
            // Each session's creation time and client, and the user's tokens with their grant
            // times, in one round trip.
            let reads: [[RedisArgument]] = members.map { ["HMGET", .string(self.sessionKey($0.handle)), "created", "client_id"] } + [["HGETALL", .string(self.userTokensKey(sub))]]
            return self.redis.sendAll(reads, on: loop).flatMapErrorThrowing { throw SessionStoreError($0) }.flatMap { replies in
                let concerned = { (client: String?) in client.map { clients?.contains($0) ?? true } ?? true }
                // Of the clients concerned (another app group's sessions are not), created up to
                // the revocation, or already gone (no `created`): deleted.
                let created = zip(members, replies).compactMap { member, reply -> ((member: String, handle: SessionHandle), Int64?)? in
                    let fields = reply.arrayValue ?? []
                    guard concerned(fields.count > 1 ? fields[1].string : nil) else { return nil }
                    return (member, fields.first?.string.flatMap(Int64.init))
                }
                let doomed = created.filter { _, at in at.map { $0 <= revokedAt } ?? true }.map(\.0)
                // A session or a token from after the revocation: the user came back since.
                let granted = Self.tokens(replies.last ?? .array(nil)).filter { concerned($0.key) }
                let superseded = created.contains { _, at in at.map { $0 > revokedAt } ?? false } || granted.values.contains { $0.grantedAt > revokedAt }
                // Everything below is in the user's slot: one transaction. The later marker wins,
                // atomically (two revocations racing must not move it back); an app group's
                // revocation writes none (the user's other groups live on).
                var commands: [[RedisArgument]] = [clients == nil
                    ? ["EVAL", .string(Self.markerScript.source), "1", .string(self.revokedKey(sub)), RedisArgument(revokedAt), RedisArgument(max(keep, 1))]
                    : ["PING"]]
                let inSlot = doomed.filter { $0.handle.sub != nil }
                if !inSlot.isEmpty { commands.append(["DEL"] + inSlot.map { .string(self.sessionKey($0.handle)) }) }
                let remembered: (SessionHandle) -> [RedisArgument] = { ["SET", .string(self.endedKey($0)), .string(end.rawValue), "PX", RedisArgument(max(keep, 1))] }
                commands += inSlot.map { remembered($0.handle) }
                if !doomed.isEmpty { commands.append(["SREM", .string(self.userSessionsKey(sub))] + doomed.map { .string($0.member) }) }
                switch forget {
                case .nothing: break
                case .grants:
                    // Only tokens granted up to the revocation: one the user got by consenting
                    // again since is theirs.
                    let dead = granted.filter { $0.value.grantedAt <= revokedAt }.keys.sorted()
                    if !dead.isEmpty { commands.append(["HDEL", .string(self.userTokensKey(sub))] + dead.flatMap { [RedisArgument.string($0), .string(Self.grantField($0))] }) }
                case .everything:
                    commands.append(["DEL", .string(self.userKey(sub)), .string(self.userTokensKey(sub))])
                }
                if !superseded, forget == .grants, clients == nil {
                    commands.append(["PEXPIRE", .string(self.userKey(sub)), RedisArgument(max(keep, 1))])
                    commands.append(["PEXPIRE", .string(self.userTokensKey(sub)), RedisArgument(max(keep, 1))])
                }
                // Sessions from before are each in their own slot, and the link's reverse in the
                // account's: after the marker, which already refuses them.
                let before = doomed.filter { $0.handle.sub == nil }
                return self.transaction(commands, on: loop).flatMap { results in
                    let ended = inSlot.isEmpty ? 0 : Int(results[1].int ?? 0)
                    let more = before.map { m in
                        self.transaction([["DEL", .string(self.sessionKey(m.handle))], remembered(m.handle)], on: loop).map { Int($0.first?.int ?? 0) }
                    }
                    return EventLoopFuture.whenAllSucceed(more, on: loop).map { ended + $0.reduce(0, +) }
                }.flatMap { ended in
                    let unlinked = forget == .everything ? self.unlink(sub, on: loop).map { _ in } : loop.makeSucceededVoidFuture()
                    return unlinked.map { Revocation(ended: ended, superseded: superseded) }
                }
            }
        }
    }

    /// The hash field holding a token's grant time (beside the client id's own field).
    static func grantField(_ clientID: String) -> String { "granted_at:" + clientID }

    /// A `user:{sub}:tokens` hash: client id → (sealed token, grant time; 0 when written before
    /// grant times were kept).
    static func tokens(_ reply: RESPValue) -> [String: (sealed: String, grantedAt: Int64)] {
        var fields: [String: String] = [:]
        let items = reply.arrayValue ?? []
        for i in stride(from: 0, to: items.count - 1, by: 2) {
            if let name = items[i].string, let value = items[i + 1].string { fields[name] = value }
        }
        var tokens: [String: (sealed: String, grantedAt: Int64)] = [:]
        for (name, value) in fields where !name.hasPrefix("granted_at:") {
            tokens[name] = (value, fields[grantField(name)].flatMap(Int64.init) ?? 0)
        }
        return tokens
    }

    public func saveRefreshToken(_ sealed: String, clientID: String, grantedAt: Int64, of sub: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        send(["HSET", .string(userTokensKey(sub)), .string(clientID), .string(sealed), .string(Self.grantField(clientID)), RedisArgument(grantedAt)], on: loop).map { _ in }
    }

    public func refreshTokens(of sub: String, on loop: any EventLoop) -> EventLoopFuture<[String: String]> {
        send(["HGETALL", .string(userTokensKey(sub))], on: loop).map { Self.tokens($0).mapValues(\.sealed) }
    }

    /// The account's reverse key first (its slot), then the link (the user's), then the previous
    /// account's reverse key: a failure in between leaves a reverse key without its link, which
    /// the next `link` of that account finds stale and takes over.
    public func link(_ sub: String, to account: String, on loop: any EventLoop) -> EventLoopFuture<LinkResult> {
        claimAccount(account, for: sub, replacing: "", on: loop).flatMap { conflict in
            if let conflict { return loop.makeSucceededFuture(.conflict(sub: conflict)) }
            return self.send(["SET", .string(self.linkKey(sub)), .string(account), "GET"], on: loop).flatMap { previous in
                guard let previous = previous.string, previous != account else { return loop.makeSucceededFuture(.linked) }
                return self.eval(Self.deleteIfScript, keys: [.string(self.accountKey(previous))], arguments: [.string(sub)], on: loop).map { _ in .linked }
            }
        }
    }

    /// Takes `account:{account}` for `sub`; answers the sub holding it when that sub's link
    /// still names the account (a real conflict), else nil (taken, a stale holder replaced).
    private func claimAccount(_ account: String, for sub: String, replacing stale: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        eval(Self.claimAccountScript, keys: [.string(accountKey(account))], arguments: [.string(sub), .string(stale)], on: loop).flatMap { reply in
            guard let holder = reply.string else { return loop.makeSucceededFuture(nil) }
            return self.send(["GET", .string(self.linkKey(holder))], on: loop).flatMap { linked in
                // Once: a holder that appears meanwhile is a real one next time.
                if linked.string == account || !stale.isEmpty { return loop.makeSucceededFuture(holder) }
                return self.claimAccount(account, for: sub, replacing: holder, on: loop)
            }
        }
    }

    /// The link first, then its reverse key (when it still names `sub`).
    public func unlink(_ sub: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        send(["GETDEL", .string(linkKey(sub))], on: loop).flatMap { reply in
            guard let account = reply.string else { return loop.makeSucceededFuture(nil) }
            return self.eval(Self.deleteIfScript, keys: [.string(self.accountKey(account))], arguments: [.string(sub)], on: loop).map { _ in account }
        }
    }

    public func account(linkedTo sub: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        send(["GET", .string(linkKey(sub))], on: loop).map { $0.string }
    }

    public func putJob(_ job: OutboxJob, on loop: any EventLoop) -> EventLoopFuture<Void> {
        send(["HSET", .string(outboxKey), .string(job.id), .string(OutboxJob.encode(job))], on: loop).map { _ in }
    }

    public func jobs(on loop: any EventLoop) -> EventLoopFuture<[OutboxJob]> {
        send(["HVALS", .string(outboxKey)], on: loop).map { reply in
            (reply.arrayValue ?? []).compactMap { $0.string.flatMap(OutboxJob.decode) }
        }
    }

    public func putNonce(_ hash: String, clientID: String, ttl: Int64, on loop: any EventLoop) -> EventLoopFuture<Void> {
        send(["SET", .string(nonceKey(hash)), .string(clientID), "PX", RedisArgument(max(ttl, 1))], on: loop).map { _ in }
    }

    public func takeNonce(_ hash: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        send(["GETDEL", .string(nonceKey(hash))], on: loop).map { $0.string }
    }

    public func job(id: String, on loop: any EventLoop) -> EventLoopFuture<OutboxJob?> {
        send(["HGET", .string(outboxKey), .string(id)], on: loop).map { $0.string.flatMap(OutboxJob.decode) }
    }

    public func removeJob(id: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        send(["HDEL", .string(outboxKey), .string(id)], on: loop).map { _ in }
    }

    public func saveProfile(_ profile: UserProfile, on loop: any EventLoop) -> EventLoopFuture<Void> {
        let fields = profile.fields
        guard !fields.isEmpty else { return loop.makeSucceededVoidFuture() }
        return send(["HSET", .string(userKey(profile.sub))] + fields.flatMap { [RedisArgument.string($0.0), .string($0.1)] }, on: loop).map { _ in }
    }

    public func profile(of sub: String, on loop: any EventLoop) -> EventLoopFuture<UserProfile?> {
        send(["HGETALL", .string(userKey(sub))], on: loop).map { reply in
            guard let f = HashReply(reply), !f.isEmpty else { return nil }
            return UserProfile(sub: sub, hash: f)
        }
    }

    /// Every key matching `pattern`, on every master.
    private func scan(_ pattern: String, on loop: any EventLoop) -> EventLoopFuture<[String]> {
        redis.scan(matching: pattern, on: loop).flatMapErrorThrowing { throw SessionStoreError($0) }
    }

    /// The part of `key` between `{` and `}` when the key is exactly `<prefix><kind>:{…}`.
    func tag(_ key: String, kind: String) -> String? {
        let head = "\(prefix)\(kind):{"
        guard key.hasPrefix(head), key.hasSuffix("}") else { return nil }
        return String(key.dropFirst(head.count).dropLast())
    }

    /// The prefix as a SCAN pattern matches it literally (`key_prefix` may hold `*?[]`).
    var literalPrefix: String {
        prefix.reduce(into: "") { out, c in
            if "*?[]\\".contains(c) { out.append("\\") }
            out.append(c)
        }
    }

    public func users(on loop: any EventLoop) -> EventLoopFuture<[String]> {
        scan("\(literalPrefix)user:{*}", on: loop).map { keys in keys.compactMap { self.tag($0, kind: "user") } }
    }

    public func putTransfer(_ record: TransferRecord, on loop: any EventLoop) -> EventLoopFuture<Void> {
        let key = transferKey(record.id)
        var commands: [[RedisArgument]] = [["HSET", .string(key), "id", .string(record.id)] + record.fields.flatMap { [RedisArgument.string($0.0), .string($0.1)] }]
        if record.to != nil { commands.append(["HDEL", .string(key), "data"]) }  // mapped: the profile holds the line's data now
        commands.append(["PEXPIRE", .string(key), RedisArgument(TransferRecord.lifetime)])
        return transaction(commands, on: loop).map { _ in }
    }

    public func transfer(_ id: String, on loop: any EventLoop) -> EventLoopFuture<TransferRecord?> {
        send(["HGETALL", .string(transferKey(id))], on: loop).map { reply in HashReply(reply).flatMap { TransferRecord(id: id, hash: $0) } }
    }

    public func transfers(on loop: any EventLoop) -> EventLoopFuture<[TransferRecord]> {
        scan("\(literalPrefix)transfer:{*}", on: loop).flatMap { keys in
            self.records(Array(Set(keys.compactMap { self.tag($0, kind: "transfer") })), found: [], on: loop)
        }
    }

    /// The records of `ids`, 500 per pipeline.
    private func records(_ ids: [String], found: [TransferRecord], on loop: any EventLoop) -> EventLoopFuture<[TransferRecord]> {
        guard !ids.isEmpty else { return loop.makeSucceededFuture(found) }
        let batch = Array(ids.prefix(500))
        return redis.sendAll(batch.map { ["HGETALL", .string(transferKey($0))] }, on: loop)
            .flatMapErrorThrowing { throw SessionStoreError($0) }
            .flatMap { replies in
                let records = zip(batch, replies).compactMap { id, reply in HashReply(reply).flatMap { TransferRecord(id: id, hash: $0) } }
                return self.records(Array(ids.dropFirst(500)), found: found + records, on: loop)
            }
    }

    public func putLogin(state: String, _ login: LoginState, ttl: Int64, on loop: any EventLoop) -> EventLoopFuture<Void> {
        let key = loginKey(state)
        var fields: [RedisArgument] = ["HSET", .string(key), "nonce", .string(login.nonce), "rd", .string(login.returnTo), "binding", .string(login.binding)]
        if let previous = login.previousSession { fields += ["previous", .string(previous)] }
        if let ticket = login.ticketBinding { fields += ["ticket", .string(ticket)] }
        return transaction([
            fields,
            ["PEXPIRE", .string(key), RedisArgument(ttl)],
        ], on: loop).map { _ in }
    }

    public func takeLogin(state: String, on loop: any EventLoop) -> EventLoopFuture<LoginState?> {
        let key = loginKey(state)
        return transaction([["HGETALL", .string(key)], ["DEL", .string(key)]], on: loop).map { replies in
            guard let f = HashReply(replies[0]), let nonce = f.string("nonce"), let rd = f.string("rd"), let binding = f.string("binding") else { return nil }
            return LoginState(nonce: nonce, returnTo: rd, binding: binding, previousSession: f.string("previous"), ticketBinding: f.string("ticket"))
        }
    }

    /// `sg:<name>` with `SET NX PX`: exactly one caller in the fleet gets it.
    public func claim(_ claim: Claim, ttl: Int64, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        send(["SET", .string(prefix + claim.name), "1", "NX", "PX", RedisArgument(max(ttl, 1))], on: loop).map { !$0.isNull }
    }

    public func release(_ claim: Claim, on loop: any EventLoop) -> EventLoopFuture<Void> {
        send(["DEL", .string(prefix + claim.name)], on: loop).map { _ in }
    }

    func validationKey(_ tokenHash: String) -> String { "\(prefix)validation:{\(tokenHash)}" }

    public func validation(of tokenHash: String, on loop: any EventLoop) -> EventLoopFuture<ValidationRecord?> {
        send(["HGETALL", .string(validationKey(tokenHash))], on: loop).map { reply in
            guard let f = HashReply(reply), let result = f.string("result").flatMap(ValidationRecord.Result.init(rawValue:)),
                  let at = f.int64("at") else { return nil }
            return ValidationRecord(result: result, at: at, failures: Int(f.int64("failures") ?? 0), retryAt: f.int64("retry_at") ?? 0)
        }
    }

    public func recordValidation(_ record: ValidationRecord, of tokenHash: String, ttl: Int64, on loop: any EventLoop) -> EventLoopFuture<Void> {
        let key = validationKey(tokenHash)
        return transaction([["HSET", .string(key), "result", .string(record.result.rawValue), "at", RedisArgument(record.at),
                             "failures", RedisArgument(Int64(record.failures)), "retry_at", RedisArgument(record.retryAt)],
                            ["PEXPIRE", .string(key), RedisArgument(max(ttl, 0))]], on: loop).map { _ in }  // 0: gone at once, as in memory
    }

    public func markValidated(_ handle: SessionHandle, at: Int64, on loop: any EventLoop) -> EventLoopFuture<Void> {
        let key = sessionKey(handle)
        return send(["EXISTS", .string(key)], on: loop).flatMap { exists in
            guard exists.int == 1 else { return loop.makeSucceededVoidFuture() }
            return self.send(["HSET", .string(key), "validated_at", RedisArgument(at)], on: loop).map { _ in }
        }
    }

    var returnURLKey: String { prefix + "apple_return_url" }

    /// `SET … GET` (Redis 6.2): one round trip, the previous value answered.
    public func swapReturnURL(_ url: String, on loop: any EventLoop) -> EventLoopFuture<String?> {
        send(["SET", .string(returnURLKey), .string(url), "GET"], on: loop).map { $0.string }
    }

    public func returnURL(on loop: any EventLoop) -> EventLoopFuture<String?> {
        send(["GET", .string(returnURLKey)], on: loop).map { $0.string }
    }

    /// A write, not `PING`: a demoted primary (a replica now) still answers `PING`, and a full
    /// one (`maxmemory`) still reads; either refuses this (`READONLY`, `OOM`), so the health
    /// watcher sees what a sign-in or a logout would meet. The key is gone in ten seconds.
    public func ping(on loop: any EventLoop) -> EventLoopFuture<Void> {
        send(["SET", .string("\(prefix)alive"), "1", "PX", "10000"], on: loop).map { _ in }
    }

    // MARK: decoding

    static func session(_ handle: SessionHandle, _ f: HashReply) -> SessionRecord? {
        guard let sub = f.string("sub"), let created = f.int64("created") else { return nil }
        return SessionRecord(handle: handle, sub: sub, clientID: f.string("client_id") ?? "", created: created,
                             lastSeen: f.int64("last_seen") ?? created, validatedAt: f.int64("validated_at") ?? created,
                             sealedRefreshToken: f.string("refresh_token"))
    }
}

/// A flat `HGETALL` reply read in place — every hash this store reads (a Redis miss is on the
/// request path): a field is found
/// by comparing its name's bytes — the hashes here hold a handful of fields — and only the
/// values asked for become `String`s; numbers are parsed from the bytes. No dictionary, and no
/// `String` per field name, is built.
struct HashReply {
    private let items: [RESPValue]

    init?(_ reply: RESPValue) {
        guard let items = reply.arrayValue, items.count % 2 == 0 else { return nil }
        self.items = items
    }

    var isEmpty: Bool { items.isEmpty }

    /// The value of field `name`: a slice of the reply's buffer.
    func value(_ name: StaticString) -> ByteBuffer? {
        var i = 0
        while i + 1 < items.count {
            if case .bulkString(let key?) = items[i], Self.equal(key, name) {
                if case .bulkString(let value) = items[i + 1] { return value }
                return nil
            }
            i += 2
        }
        return nil
    }

    func string(_ name: StaticString) -> String? { value(name).map { String(buffer: $0) } }
    func int64(_ name: StaticString) -> Int64? { value(name).flatMap(RESPDecimal.int64) }
    func flag(_ name: StaticString) -> Bool? { value(name).map { Self.equal($0, "true") } }

    /// Byte by byte with indices: the request path's debug build allocates in generic
    /// collection algorithms (`allSatisfy`, `elementsEqual`), and allocations are counted there.
    static func equal(_ buffer: ByteBuffer, _ text: StaticString) -> Bool {
        guard buffer.readableBytes == text.utf8CodeUnitCount else { return false }
        return buffer.withUnsafeReadableBytes { raw in
            let expected = text.utf8Start
            var i = 0
            while i < raw.count {
                if raw[i] != expected[i] { return false }
                i += 1
            }
            return true
        }
    }

    /// A reply that is a decimal number (a bulk string, as `GET` answers).
    static func int64(_ reply: RESPValue) -> Int64? {
        if case .bulkString(let value?) = reply { return RESPDecimal.int64(value) }
        return nil
    }
}

extension UserProfile {
    /// The profile from its hash (nil: the user has no stored profile).
    init(sub: String, hash: HashReply?) {
        guard let hash else {
            self.init(sub: sub)
            return
        }
        self.init(sub: sub, name: hash.string("name"), email: hash.string("email"), emailVerified: hash.flag("email_verified"),
                  privateEmail: hash.flag("private_email"), emailForwarding: hash.string("email_forwarding"),
                  realUserStatus: hash.int64("real_user_status").map { Int($0) }, emailEventAt: hash.int64("email_event_at"))
        formerSub = hash.string("former_sub")
        transferredAt = hash.int64("transferred_at")
    }
}

extension TransferRecord {
    /// nil for an empty hash (no record).
    init?(id: String, hash: HashReply) {
        guard !hash.isEmpty else { return nil }
        self.init(id: id, from: hash.string("from"), target: hash.string("target"), data: hash.string("data"), to: hash.string("to"),
                  mappedAt: hash.int64("mapped_at"))
    }
}

extension RESPValue {
    var arrayValue: [RESPValue]? {
        if case .array(let items?) = self { return items }
        return nil
    }
}
