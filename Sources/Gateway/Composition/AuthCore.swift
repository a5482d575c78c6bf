import AppleID
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Sessions

/// What sign-in and admission keep for the life of the process, whatever reloads do: the
/// session keys and the other secrets read at start, the store and its local cache, Apple, the
/// revocation path, open tunnels, the outbox and the app's events. A value of parts, each built
/// by the composition root (`GatewayComposition`) from the keys a reload may not change
/// (`ReloadRules.restartOnly`); what a reload changes is an `Authenticator`.
struct AuthCore: Sendable {
    let secrets: StartupSecrets
    var keys: SessionKeys { secrets.sessionKeys }
    /// The bounded, measured store (`GatewayStore`).
    let store: any SessionStore
    let cache: LocalSessionCache<CachedSession>
    let apple: AppleServices?
    /// Daily re-validation with Apple (when `apple:` is configured).
    let revalidator: Revalidator?
    let revocations: Revocations
    /// Open WebSocket tunnels, ended when their session is.
    let tunnels: TunnelRegistry
    /// Work done at least once across the fleet: revocations at Apple, events for the app.
    let outbox: Outbox
    /// `events.url`: what the app is told (nil: not configured).
    let events: AppEvents?
    /// `identity.link_lookup_url`: the app's answer to "whose account is this email?".
    let linkLookup: LinkLookup?
    /// Code exchanges per key in the current minute (`apple.exchanges_per_minute`).
    let exchanges: NIOLockedValueBox<RateWindows>
    /// Login states and native nonces written, per client and for the instance
    /// (`apple.logins_per_minute`, `apple.max_pending_logins`).
    let anonymousWrites: NIOLockedValueBox<AnonymousWrites>
    /// `tracing`: nil when nothing is traced.
    let tracer: GatewayTracer?
    let metrics: GatewayMetrics
    let logger: Logger
    let now: @Sendable () -> Int64

    /// Queues every refresh token the store holds for the user (their sessions' and the ones kept
    /// per client) granted up to `upTo` for revocation at Apple, and tries them now (bounded by
    /// `apple.timeout` each). Answers how many were queued and how many Apple confirmed; the
    /// rest stay in the outbox and are retried until Apple answers.
    func revokeAtApple(_ sub: String, upTo: Int64, on loop: any EventLoop) async throws -> (queued: Int, revoked: Int) {
        let ids = try await store.queueAppleRevocations(of: sub, now: now(), upTo: upTo, keys: keys, on: loop)
        let done = await outbox.runDue(only: Set(ids))
        return (ids.count, done.count)
    }
}
