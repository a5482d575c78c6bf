/// The bounds on what an anonymous request may write to the store: a login state
/// (`GET /login`) or a native nonce (`POST /native/nonce`), each kept 10 minutes. Pure; the
/// process keeps one behind a lock (`AuthCore.anonymousWrites`).
///
/// Two limits, both `RateWindows`: per client address (`apple.logins_per_minute`, each
/// endpoint its own window, so an app's nonces never use up the browser's logins), and per
/// instance (`apple.max_pending_logins` per 10-minute window, the writes' lifetime, so at most
/// twice that many are outstanding from one instance) — the bound that holds when a botnet
/// spreads the writes over many addresses.
struct AnonymousWrites: Sendable {
    enum Kind: String, Sendable, CaseIterable {
        case login
        case nativeNonce = "native_nonce"
    }

    enum Verdict: Sendable, Equatable {
        case admitted
        /// This client is over its limit: 429.
        case throttled(retryAfter: Int)
        /// The instance is over its cap, whoever asks: 503.
        case busy(retryAfter: Int)
    }

    /// How long a login state or a native nonce lives in the store (milliseconds); the
    /// instance cap's window.
    static let lifetime: Int64 = 600_000

    private var clients = RateWindows()
    private var instance = RateWindows(capacity: 1)

    /// One more write of `kind` for `client` at `t`. A client over its limit spends nothing of
    /// the instance's cap (a flooder cannot use it up alone), and a refusal by the cap adds no
    /// client window (the table cannot be filled past what the cap admits). 0: no limit.
    mutating func admit(_ kind: Kind, client: String, now t: Int64, perClient: Int, perInstance: Int) -> Verdict {
        if let wait = instance.refusal("", now: t, limit: perInstance) { return .busy(retryAfter: wait) }
        if let wait = clients.admit(kind.rawValue + " " + client, now: t, limit: perClient) { return .throttled(retryAfter: wait) }
        _ = instance.admit("", now: t, limit: perInstance, window: Self.lifetime)
        return .admitted
    }
}
