import GatewayConfig
import Logging
import NIOPosix
import Sessions

/// What the operator commands (`sessiongate sessions …`, `migrate import`'s events) do to the configured Redis store,
/// through the core a running gateway uses (`GatewayComposition`): the same bounded store, the
/// same revocation path — its fleet message, its `user.revoked` event for the app
/// (`events.url`), its log line. The command reads the same files `serve` reads.
public struct OperatorTools: Sendable {
    private let parts: GatewayComposition.Parts
    private let absoluteTimeout: Int64
    private let group: MultiThreadedEventLoopGroup

    /// Reads the secrets and makes the store's connections (nothing connects before first use).
    public init(configuration c: GatewayConfiguration, group: MultiThreadedEventLoopGroup = .singleton, logger: Logger,
                now: @escaping @Sendable () -> Int64 = SessionClock.now) throws {
        parts = try GatewayComposition.build(c, group: group, metrics: GatewayMetrics(), logger: logger, now: now, subscribe: false)
        absoluteTimeout = Authenticator.milliseconds(c.session.absoluteTimeout)
        self.group = group
    }

    /// A user's live sessions.
    public func sessions(of sub: String) async throws -> [SessionRecord] {
        try await parts.core.store.sessions(of: sub, on: group.next()).get()
    }

    /// Ends every session of `sub` created up to now, everywhere (`Revocations.revokeUser`,
    /// source `operator`): the running gateways drop the user at once, the app is told
    /// `user.revoked` with reason `operator` — or, with `forget`, `user.deleted`.
    /// - Parameters:
    ///   - queueAtApple: first queue every refresh token the store holds for the user for
    ///     revocation at Apple, as stored (sealed under the gateways' key; they revoke them).
    ///   - forget: delete everything the store holds of the user (profile, tokens, link).
    /// - Returns: the sessions ended, and the tokens queued.
    public func revoke(_ sub: String, queueAtApple: Bool, forget: Bool) async throws -> (sessions: Int, queued: Int) {
        let loop = group.next()
        let core = parts.core
        // Before the sessions are deleted: their tokens are queued as stored.
        let queued = queueAtApple ? try await core.store.queueAppleRevocations(of: sub, now: core.now(), on: loop).count : 0
        // Tokens queued for Apple are gone from the store with the sessions.
        let forgetting: Forgetting = forget ? .everything : queueAtApple ? .grants : .nothing
        let event: (AppEventKind, String) = forget ? (.userDeleted, "operator") : (.userRevoked, "operator")
        let outcome = try await core.revocations.revokeUser(sub, source: .operator_, keep: absoluteTimeout, forget: forgetting, event: event, on: loop).get()
        return (outcome.ended, queued)
    }

    /// Tells the app that `migrate import` mapped `user` (`user.transferred`, reason `import`),
    /// as a running gateway tells it when a sign-in maps one; `close` waits for its first attempt.
    public func transferred(_ user: TransferredUser) {
        parts.core.events?.transferred(user, reason: "import")
    }

    /// Waits for the event's first delivery attempt, then closes the connections.
    public func close() async {
        await parts.resources.close()
    }
}
