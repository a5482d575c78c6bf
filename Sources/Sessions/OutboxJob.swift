import NIOCore

/// Work that must happen at least once, whatever instance dies: a token to revoke at Apple, an
/// event to deliver to the app. Kept in the store until done; each attempt is claimed by one
/// instance (`Claim.job`).
public struct OutboxJob: Sendable, Equatable {
    public enum Kind: String, Sendable, CaseIterable { case appleRevoke = "apple_revoke", event }
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
    public var jobID: String { Self.jobID(naming: sealedToken) }

    /// `revoke-` and 32 hex digits of SHA-256 of `value` (the sealed token, or — when the queuer
    /// can open it — the token itself, so that one token sealed twice is queued once).
    static func jobID(naming value: String) -> String { "revoke-" + sha256Hex(value).prefix(32) }
}

extension SessionStore {
    /// Queues every refresh token the store holds for `sub` (their sessions' and the ones kept
    /// per client) for revocation at Apple, sealed as stored; answers the jobs' ids. Done before
    /// the sessions are deleted.
    /// - Parameters:
    ///   - upTo: only what was granted up to this time (Unix ms; nil: everything).
    ///   - keys: when given (a gateway), a token stored twice (in a session and per client) is
    ///     queued once; without (the CLI), Apple answers the second revocation 200.
    public func queueAppleRevocations(of sub: String, now t: Int64, upTo: Int64? = nil, keys: SessionKeys? = nil, on loop: any EventLoop) async throws -> [String] {
        let sessions = try await sessions(of: sub, on: loop).get()
        var revocations = sessions.filter { $0.created <= upTo ?? .max }.compactMap { session in
            session.sealedRefreshToken.map { AppleRevocation(clientID: session.clientID, context: session.handle.key, sealedToken: $0) }
        }
        // The token kept per client is that client's latest grant's: a sign-in to it after
        // `upTo` (a new consent, e.g. while a disconnect was held through a store outage) keeps it.
        let regranted = Set(sessions.filter { $0.created > upTo ?? .max }.map(\.clientID))
        let kept = try await refreshTokens(of: sub, on: loop).get().filter { !regranted.contains($0.key) }
        for (clientID, sealed) in kept.sorted(by: { $0.key < $1.key }) {
            revocations.append(AppleRevocation(clientID: clientID, context: SessionKeys.userContext(sub), sealedToken: sealed))
        }
        var ids: [String] = []
        for r in revocations {
            var id = r.jobID
            if let keys, let token = keys.open(r.sealedToken, context: r.context) { id = AppleRevocation.jobID(naming: token) }
            guard !ids.contains(id) else { continue }
            ids.append(id)
            try await putJob(OutboxJob(id: id, kind: .appleRevoke, payload: r.payload, nextAttempt: t, created: t), on: loop).get()
        }
        return ids
    }
}
