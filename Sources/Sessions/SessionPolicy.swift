
/// How long sessions live (milliseconds); reloadable.
public struct SessionTimes: Sendable, Equatable {
    public var idle: Int64
    public var absolute: Int64

    public init(idle: Int64, absolute: Int64) {
        self.idle = idle
        self.absolute = absolute
    }

    /// Why a stored session is over at `t`, or nil while it lives.
    public func end(of s: StoredSession, now t: Int64) -> SessionPolicy.End? {
        if s.isRevoked { return .revoked }
        if t - s.session.created >= absolute { return .absoluteTimeout }
        if t - s.session.lastSeen >= idle { return .idleTimeout }
        return nil
    }

    public func isLive(_ s: StoredSession, now t: Int64) -> Bool { end(of: s, now: t) == nil }
}

/// The daily re-validation's times (DESIGN §3; milliseconds).
public struct RevalidationTimes: Sendable, Equatable {
    /// `apple.revalidate_after`.
    public var after: Int64
    /// `apple.revalidate_grace`: stale by less, the request goes through and Apple is asked in
    /// the background.
    public var grace: Int64
    /// `apple.outage_grace`: Apple unable to say for longer than this since the last success,
    /// the session is denied (and Apple no longer asked about it).
    public var outageGrace: Int64

    public init(after: Int64, grace: Int64, outageGrace: Int64) {
        self.after = after
        self.grace = grace
        self.outageGrace = outageGrace
    }

    /// When a session's validation comes due: `revalidate_after` after the last success, plus
    /// up to 1/24 of it (at most an hour) of per-session jitter, so that a burst of sign-ins does
    /// not become a burst of Apple calls a day later. Never earlier than `revalidate_after`.
    public func dueAt(_ session: SessionRecord) -> Int64 {
        let window = min(after / 24, 3_600_000)
        guard window > 0 else { return session.validatedAt + after }
        let seed = session.handle.key.utf8.prefix(8).reduce(UInt64(0)) { $0 &* 31 &+ UInt64($1) }
        return session.validatedAt + after + Int64(seed % UInt64(window))
    }
}

/// What a stored session is worth at an instant (DESIGN §3), decided without I/O: the resolver
/// (the gateway's `Authenticator.lookup`) only reads the cache and the store and acts on the decision.
public struct SessionPolicy: Sendable, Equatable {
    public var times: SessionTimes
    /// `last_seen` is written at most this often per session.
    public var touchInterval: Int64
    /// nil without `apple:` (nothing to re-validate).
    public var revalidation: RevalidationTimes?

    /// Why a session is over (a label for logs and metrics).
    public enum End: String, Sendable {
        case revoked
        case absoluteTimeout = "absolute_timeout"
        case idleTimeout = "idle_timeout"
    }

    public enum Revalidation: Sendable, Equatable {
        case none
        /// Stale by less than `revalidate_grace`: answer now, ask Apple in the background.
        case background
        /// Stale beyond it: the request waits for Apple's answer.
        case beforeAnswering
    }

    public enum Decision: Sendable, Equatable {
        case dead(End)
        case live(touch: Bool, revalidation: Revalidation)
    }

    public init(times: SessionTimes, revalidation: RevalidationTimes?) {
        self.times = times
        self.touchInterval = min(60_000, max(1000, times.idle / 4))
        self.revalidation = revalidation
    }

    public func decide(_ s: StoredSession, now t: Int64) -> Decision {
        if let end = times.end(of: s, now: t) { return .dead(end) }
        let touch = t - s.session.lastSeen >= touchInterval
        guard let revalidation, s.session.sealedRefreshToken != nil else { return .live(touch: touch, revalidation: .none) }
        let due = revalidation.dueAt(s.session)
        if t < due { return .live(touch: touch, revalidation: .none) }
        return .live(touch: touch, revalidation: t - due < revalidation.grace ? .background : .beforeAnswering)
    }

    /// When Apple could not say (down, throttled, our client refused): a session is kept within
    /// `outage_grace` of its last success, then denied.
    public func keepsWithoutApple(_ session: SessionRecord, now t: Int64) -> Bool {
        guard let revalidation else { return true }
        return t - session.validatedAt <= revalidation.outageGrace
    }

    /// The idle expiry a touch at `t` writes (capped by the absolute one).
    public func expiry(afterTouching session: SessionRecord, at t: Int64) -> Int64 {
        min(session.created + times.absolute, t + times.idle)
    }
}

/// When the gateway may ask Apple about a refresh token (or probe a client Apple refused or
/// throttles), from the fleet's record of the last attempt (DESIGN §3, issue 13 §2, issue 39
/// §5): exponential backoff with jitter after each failure, Apple's `Retry-After` honoured, and
/// no more calls once `outage_grace` has ended the sessions that hold the token. Pure; the
/// gateway's `Revalidator` does the I/O.
public struct RetryPolicy: Sendable, Equatable {
    /// The first retry's delay (ms): 1/1440 of `revalidate_after` (a minute for a day), 1 s to 60 s.
    public var base: Int64
    /// The longest delay between two attempts (ms): a quarter of `revalidate_after`, at most 6 h,
    /// so that Apple's return is noticed well within `outage_grace`.
    public var cap: Int64
    /// The first retry's delay after Apple throttled us (429, ms): 1/96 of `revalidate_after`
    /// (15 minutes for a day), from `base` to `cap`. Throttling is Apple asking for fewer calls:
    /// the schedule starts where an outage's is after four failures.
    public var throttledBase: Int64
    public var outageGrace: Int64

    public init(_ times: RevalidationTimes) {
        base = min(60_000, max(1000, times.after / 1440))
        cap = max(base, min(6 * 3_600_000, times.after / 4))
        throttledBase = min(cap, max(base, times.after / 96))
        outageGrace = times.outageGrace
    }

    /// Why an attempt failed: Apple unreachable or failing (each token backs off on its own), or
    /// Apple throttling our client (the client's circuit backs the fleet off, on the slower
    /// schedule).
    public enum Failure: Sendable, Equatable {
        case unavailable
        case throttled
    }

    public enum Step: Sendable, Equatable {
        /// The fleet has a success newer than the session's: adopt it, no call.
        case adopt(validatedAt: Int64)
        /// Apple refused the token (the user is revoked).
        case revoked
        /// A failure is being backed off: no call; Apple cannot say yet.
        case wait
        /// Failing since beyond `outage_grace`: the session is denied, Apple is not asked.
        case givenUp
        /// Ask Apple; `failures` attempts in a row have failed before.
        case ask(failures: Int)
    }

    public func step(_ record: ValidationRecord?, validatedAt: Int64, now t: Int64) -> Step {
        guard let record else { return .ask(failures: 0) }
        switch record.result {
        case .ok: return record.at > validatedAt ? .adopt(validatedAt: record.at) : .ask(failures: 0)
        case .revoked: return .revoked
        case .failed:
            if t < record.retryAt { return .wait }
            return t - validatedAt > outageGrace ? .givenUp : .ask(failures: record.failures)
        }
    }

    /// What a client's circuit (open after Apple refused or throttled our client) says of a call
    /// about a session last validated at `validatedAt`.
    public enum Circuit: Sendable, Equatable {
        /// Closed: the call goes to Apple.
        case closed
        /// Open, its retry not due: no call.
        case holds
        /// Open and due: one probe (a claim) goes to Apple for the whole fleet.
        case probe
        /// Open and due, but the session is beyond `outage_grace` (denied already): it is not
        /// the one to probe with — Apple's answer could not keep it anyway.
        case givenUp
    }

    public func circuit(_ record: ValidationRecord?, validatedAt: Int64, now t: Int64) -> Circuit {
        guard let record, record.result == .failed else { return .closed }
        if t < record.retryAt { return .holds }
        return t - validatedAt > outageGrace ? .givenUp : .probe
    }

    /// The delay after `failures` failed attempts in a row: doubling from `base` (`throttledBase`
    /// when Apple throttled the last one) up to `cap`, half of it fixed and half spread by
    /// `jitter` (0 ..< 1) so that tokens that failed together do not retry together.
    public func delay(failures: Int, jitter: Double, _ failure: Failure = .unavailable) -> Int64 {
        let first = failure == .throttled ? throttledBase : base
        let doubled = failures <= 1 ? first : first << Int64(min(failures - 1, 30))
        let d = min(cap, max(first, doubled))
        return d / 2 + Int64(Double(d / 2) * min(max(jitter, 0), 1))
    }

    /// The record of a failed attempt at `t` after `previous`: one more failure, and the next
    /// attempt after the backoff or Apple's `Retry-After` (seconds), whichever is later.
    public func failed(after previous: ValidationRecord?, at t: Int64, retryAfter: Int?, jitter: Double,
                       _ failure: Failure = .unavailable) -> ValidationRecord {
        let failures = (previous?.result == .failed ? previous?.failures ?? 0 : 0) + 1
        let wait = max(delay(failures: failures, jitter: jitter, failure), Int64(retryAfter ?? 0) * 1000)
        return ValidationRecord(result: .failed, at: t, failures: failures, retryAt: t + wait)
    }

    /// How long the store keeps a failure: until its retry, then `outage_grace` more, so that a
    /// given-up token stays given up (one attempt per `outage_grace` at most).
    public func keep(_ record: ValidationRecord, now t: Int64) -> Int64 {
        max(0, record.retryAt - t) + outageGrace
    }
}
