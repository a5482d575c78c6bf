import NIOCore

/// One signed-in session (DESIGN §3, `sg:session:{hash}`). Times are Unix milliseconds.
public struct SessionRecord: Sendable, Equatable {
    public var handle: SessionHandle
    public var sub: String
    /// The client id the session was issued for (the Services ID on the web, an App ID natively).
    public var clientID: String
    public var created: Int64
    public var lastSeen: Int64
    /// The last successful validation with Apple (sign-in counts as one).
    public var validatedAt: Int64
    /// Apple's refresh token, sealed with `SessionKeys.seal` (never stored in the clear).
    public var sealedRefreshToken: String?

    public init(handle: SessionHandle, sub: String, clientID: String, created: Int64, lastSeen: Int64, validatedAt: Int64, sealedRefreshToken: String?) {
        self.handle = handle
        self.sub = sub
        self.clientID = clientID
        self.created = created
        self.lastSeen = lastSeen
        self.validatedAt = validatedAt
        self.sealedRefreshToken = sealedRefreshToken
    }
}

/// What the gateway knows about a user (`sg:user:{sub}`). Every field but `sub` is optional:
/// Apple sends the name once, the email only with the `email` scope.
public struct UserProfile: Sendable, Equatable {
    public var sub: String
    public var name: String?
    public var email: String?
    public var emailVerified: Bool?
    public var privateEmail: Bool?
    /// `enabled`/`disabled`, from Apple's email notifications.
    public var emailForwarding: String?
    public var realUserStatus: Int?
    /// The `event_time` (Unix ms) of the last email notification applied: an older one that
    /// arrives late is ignored.
    public var emailEventAt: Int64?

    public init(sub: String, name: String? = nil, email: String? = nil, emailVerified: Bool? = nil, privateEmail: Bool? = nil,
                emailForwarding: String? = nil, realUserStatus: Int? = nil, emailEventAt: Int64? = nil) {
        self.sub = sub
        self.name = name
        self.email = email
        self.emailVerified = emailVerified
        self.privateEmail = privateEmail
        self.emailForwarding = emailForwarding
        self.realUserStatus = realUserStatus
        self.emailEventAt = emailEventAt
    }

    /// `self` with every field `update` has replaced; absent fields are kept (a later sign-in
    /// without the name keeps the stored name).
    public func merged(with update: UserProfile) -> UserProfile {
        var p = self
        if let v = update.name { p.name = v }
        if let v = update.email { p.email = v }
        if let v = update.emailVerified { p.emailVerified = v }
        if let v = update.privateEmail { p.privateEmail = v }
        if let v = update.emailForwarding { p.emailForwarding = v }
        if let v = update.realUserStatus { p.realUserStatus = v }
        if let v = update.emailEventAt { p.emailEventAt = v }
        return p
    }

    var fields: [(String, String)] {
        var f: [(String, String)] = []
        if let name { f.append(("name", name)) }
        if let email { f.append(("email", email)) }
        if let emailVerified { f.append(("email_verified", emailVerified ? "true" : "false")) }
        if let privateEmail { f.append(("private_email", privateEmail ? "true" : "false")) }
        if let emailForwarding { f.append(("email_forwarding", emailForwarding)) }
        if let realUserStatus { f.append(("real_user_status", String(realUserStatus))) }
        if let emailEventAt { f.append(("email_event_at", String(emailEventAt))) }
        return f
    }
}

/// A session as admission needs it: the session, its user, and the user's revocation time.
public struct StoredSession: Sendable, Equatable {
    public var session: SessionRecord
    public var user: UserProfile
    /// Sessions created before this (Unix ms) are dead.
    public var revokedAt: Int64?

    public init(session: SessionRecord, user: UserProfile, revokedAt: Int64?) {
        self.session = session
        self.user = user
        self.revokedAt = revokedAt
    }

    public var isRevoked: Bool { revokedAt.map { session.created <= $0 } ?? false }
}

/// The outcome of validating a refresh token with Apple, shared by the fleet. Also a client's
/// circuit (`Revalidator`: the record of `client:<client id>`, open after `invalid_client`).
public struct ValidationRecord: Sendable, Equatable {
    public enum Result: String, Sendable { case ok, revoked, failed }
    public var result: Result
    /// Unix ms.
    public var at: Int64
    /// Failed attempts in a row (0 unless `failed`).
    public var failures: Int
    /// No attempt before this time (Unix ms; 0: none scheduled): the backoff, or Apple's `Retry-After`.
    public var retryAt: Int64
    public init(result: Result, at: Int64, failures: Int = 0, retryAt: Int64 = 0) {
        self.result = result
        self.at = at
        self.failures = failures
        self.retryAt = retryAt
    }
}

/// Work that must happen at least once, whatever instance dies: a token to revoke at Apple, an
/// event to deliver to the app. Kept in the store until done; each attempt is claimed by one
/// instance (`Claim.job`).
public struct OutboxJob: Sendable, Equatable {
    public enum Kind: String, Sendable { case appleRevoke = "apple_revoke", event }
    public var id: String
    public var kind: Kind
    /// What the job carries (a sealed token and its client; an event's body and URL), encoded
    /// by its owner.
    public var payload: String
    public var attempts: Int
    /// Unix ms: not before.
    public var nextAttempt: Int64
    /// Unix ms: when it was first queued.
    public var created: Int64

    public init(id: String, kind: Kind, payload: String, attempts: Int = 0, nextAttempt: Int64, created: Int64) {
        self.id = id
        self.kind = kind
        self.payload = payload
        self.attempts = attempts
        self.nextAttempt = nextAttempt
        self.created = created
    }
}

extension OutboxJob {
    /// One line: `id kind attempts next created payload` (the payload last: it may hold spaces).
    static func encode(_ job: OutboxJob) -> String {
        "\(job.id) \(job.kind.rawValue) \(job.attempts) \(job.nextAttempt) \(job.created) \(job.payload)"
    }

    static func decode(_ line: String) -> OutboxJob? {
        let parts = line.split(separator: " ", maxSplits: 5, omittingEmptySubsequences: false)
        guard parts.count == 6, let kind = Kind(rawValue: String(parts[1])), let attempts = Int(parts[2]),
              let next = Int64(parts[3]), let created = Int64(parts[4]) else { return nil }
        return OutboxJob(id: String(parts[0]), kind: kind, payload: String(parts[5]), attempts: attempts, nextAttempt: next, created: created)
    }
}

/// An outbox job's payload: a refresh token to revoke at Apple, still sealed as it was stored
/// (whoever queues it needs no key; the gateway that runs it opens it).
public struct AppleRevocation: Sendable, Equatable {
    public var clientID: String
    /// The sealing context (`SessionKeys.userContext(sub)` or a session's store key).
    public var context: String
    public var sealedToken: String

    public init(clientID: String, context: String, sealedToken: String) {
        self.clientID = clientID
        self.context = context
        self.sealedToken = sealedToken
    }

    /// Space-separated: client ids, contexts and sealed tokens hold no spaces (a context's sub
    /// is Apple's, `[0-9a-z.]`).
    public var payload: String { clientID + " " + context + " " + sealedToken }

    public init?(payload: String) {
        let parts = payload.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 3, parts.allSatisfy({ !$0.isEmpty }) else { return nil }
        self.init(clientID: String(parts[0]), context: String(parts[1]), sealedToken: String(parts[2]))
    }

    /// The job's id: one per stored token (queued twice, it is revoked once).
    public var jobID: String { "revoke-" + sha256Hex(sealedToken).prefix(32) }
}

/// A fleet-wide claim (`SET NX PX`): held by one caller at a time until released or expired.
/// Its store key carries the hash tag DESIGN §3 gives it (one cluster slot per subject).
public enum Claim: Sendable, Equatable {
    /// The single flight of a refresh token's validation: `lock:validation:{<token hash>}`.
    case validation(tokenHash: String)
    /// The one probe of a client Apple refused: `lock:probe:{<client id>}`.
    case probe(clientID: String)
    /// A notification already acted on (dedupe by `jti`): `notification:{<jti>}`.
    case notification(jti: String)
    /// One attempt at an outbox job: `lock:job:{<id>}`.
    case job(id: String)

    /// The key under the store's prefix.
    public var name: String {
        switch self {
        case .validation(let hash): "lock:validation:{" + hash + "}"
        case .probe(let clientID): "lock:probe:{" + clientID + "}"
        case .notification(let jti): "notification:{" + jti + "}"
        case .job(let id): "lock:job:{" + id + "}"
        }
    }
}

/// A web login between `/login` and `/callback` (`sg:login:{state}`): single use, 10 minutes.
public struct LoginState: Sendable, Equatable {
    public var nonce: String
    /// Where to go after sign-in: a validated path or allow-listed URL.
    public var returnTo: String
    /// SHA-256 (hex) of the pre-auth cookie's value: binds the login to one browser.
    public var binding: String
    /// The store key of the session this browser presented when the login started: ended
    /// when the new one is created (Apple's callback is a cross-site POST, so the `Lax` session
    /// cookie does not arrive with it).
    public var previousSession: String?

    public init(nonce: String, returnTo: String, binding: String, previousSession: String? = nil) {
        self.nonce = nonce
        self.returnTo = returnTo
        self.binding = binding
        self.previousSession = previousSession
    }
}

/// A store failed to answer (down, slow, or nonsense): admission answers 503 and keeps the
/// cookie; nothing is concluded about the session.
public struct SessionStoreError: Error, CustomStringConvertible {
    public var reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { "session store unavailable: \(reason)" }
}

/// Where sessions live: memory (one instance) or Redis (a fleet). Both implementations pass
/// the same contract suite (`Tests/SessionsTests/SessionStoreContract.swift`). Every call
/// answers on `eventLoop` and fails only with `SessionStoreError`.
public protocol SessionStore: Sendable {
    /// Saves a new session (expiring at `expiresAt`) and merges `profile` into the user's.
    func create(_ session: SessionRecord, profile: UserProfile, expiresAt: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// The session with its user and revocation marker; nil when unknown or expired.
    func load(_ handle: SessionHandle, on eventLoop: any EventLoop) -> EventLoopFuture<StoredSession?>
    /// Records activity: `last_seen` and the new expiry (idle timeout, capped by the absolute one).
    func touch(_ handle: SessionHandle, lastSeen: Int64, expiresAt: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Ends one session (logout).
    func delete(_ handle: SessionHandle, sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// The user's live sessions, oldest first.
    func sessions(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<[SessionRecord]>
    /// Records `revokedAt` for the user (a later revocation already recorded wins), kept `keep`
    /// milliseconds (sessions older than that are gone anyway: the absolute timeout), and
    /// deletes the sessions created up to it; answers how many. A session created after
    /// `revokedAt` (the user signed in again before a late notification) is kept. With
    /// `forget`, the user's profile and stored refresh tokens are deleted too (deletion
    /// compliance: nothing but the marker remains, and it expires).
    func revoke(_ sub: String, at revokedAt: Int64, keep: Int64, forget: Bool, on eventLoop: any EventLoop) -> EventLoopFuture<Int>
    /// Keeps the user's latest refresh token for `clientID` (sealed for the user) beyond their
    /// sessions, so that a deletion can revoke it at Apple.
    func saveRefreshToken(_ sealed: String, clientID: String, of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// The user's stored refresh tokens (sealed), by client id.
    func refreshTokens(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<[String: String]>
    /// Saves (or replaces) a job of the store-backed outbox.
    func putJob(_ job: OutboxJob, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Every job of the outbox (it is small: failures waiting for a retry).
    func jobs(on eventLoop: any EventLoop) -> EventLoopFuture<[OutboxJob]>
    /// Removes a job once done (or given up).
    func removeJob(id: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Merges fields into the user's profile (creating it).
    func saveProfile(_ profile: UserProfile, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// The user's profile, if any.
    func profile(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<UserProfile?>
    /// Saves a login for `ttl` milliseconds.
    func putLogin(state: String, _ login: LoginState, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Takes a login out: the second call for the same state answers nil.
    func takeLogin(state: String, on eventLoop: any EventLoop) -> EventLoopFuture<LoginState?>
    /// Takes `claim` for `ttl` milliseconds; true only for the one caller that gets it,
    /// fleet-wide (Redis `SET NX PX`).
    func claim(_ claim: Claim, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Bool>
    /// Gives a claim up (a lock released; a notification whose processing failed).
    func release(_ claim: Claim, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// The fleet's last re-validation result for a refresh token (`validation:<token hash>`).
    func validation(of tokenHash: String, on eventLoop: any EventLoop) -> EventLoopFuture<ValidationRecord?>
    /// Records a re-validation result for `ttl` milliseconds.
    func recordValidation(_ record: ValidationRecord, of tokenHash: String, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Sets a session's `validated_at`.
    func markValidated(_ handle: SessionHandle, at: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Succeeds when the store answers (readiness).
    func ping(on eventLoop: any EventLoop) -> EventLoopFuture<Void>
}

extension SessionStore {
    /// Queues every refresh token the store holds for `sub` (their sessions' and the ones kept
    /// per client) for revocation at Apple, sealed as stored; answers the jobs' ids. Done before
    /// the sessions are deleted.
    /// - Parameter keys: when given (a gateway), a token stored twice (in a session and per
    ///   client) is queued once; without (the CLI), Apple answers the second revocation 200.
    public func queueAppleRevocations(of sub: String, now t: Int64, keys: SessionKeys? = nil, on loop: any EventLoop) async throws -> [String] {
        var revocations = try await sessions(of: sub, on: loop).get().compactMap { session in
            session.sealedRefreshToken.map { AppleRevocation(clientID: session.clientID, context: session.handle.key, sealedToken: $0) }
        }
        for (clientID, sealed) in try await refreshTokens(of: sub, on: loop).get().sorted(by: { $0.key < $1.key }) {
            revocations.append(AppleRevocation(clientID: clientID, context: SessionKeys.userContext(sub), sealedToken: sealed))
        }
        var ids: [String] = []
        for r in revocations {
            var id = r.jobID
            if let keys, let token = keys.open(r.sealedToken, context: r.context) { id = "revoke-" + sha256Hex(token).prefix(32) }
            guard !ids.contains(id) else { continue }
            ids.append(id)
            try await putJob(OutboxJob(id: id, kind: .appleRevoke, payload: r.payload, nextAttempt: t, created: t), on: loop).get()
        }
        return ids
    }
}
