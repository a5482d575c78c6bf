import AppleID
import HTTPProxy
import NIOCore
import NIOHTTP1
import Sessions

/// What Apple tells us about a user (server-to-server notifications), and the user's own
/// disconnect or deletion.
extension AuthEndpointGuard {
    // MARK: Apple's notifications and the user's disconnect or deletion

    /// `POST /_auth/apple/notifications` (apple-sign-in.md §8.4): verified, deduplicated by
    /// `jti` across the fleet, acted on, answered 200 — also for unknown users and types, so Apple
    /// stops retrying; 400 only when the payload can never verify. One the store did not take, or
    /// that cannot be verified yet (Apple's keys unreachable), is held (`HeldRevocations`) and
    /// answered 200: Apple's retries are not relied on. 503 only when it could not be held.
    func notification(body: ByteBuffer, on loop: any EventLoop) async -> LocalResponse {
        guard core.apple != nil else { return Self.notConfigured() }
        let bytes = Array(body.readableBytesView)
        let held: HeldRevocation.Action
        let failure: any Error
        let type: GatewayMetrics.NotificationType
        switch await core.takeNotification(bytes, keep: auth.absoluteTimeout, on: loop) {
        case .taken:
            return LocalResponse(status: .ok)
        case .unverifiable(let error):
            return .error(.badRequest, "unverifiable notification: \(error.rawValue)")
        case .keysUnavailable(let error):
            (held, failure, type) = (.notification(body: String(decoding: bytes, as: UTF8.self)), error, .unverified)
        case .storeFailed(let t, let action, let error):
            (held, failure, type) = (action, error, t)
        }
        guard await core.revocations.hold(held, keep: auth.absoluteTimeout, why: failure) else {
            core.metrics.recordNotification(type: type, result: .storeUnavailable)
            return .error(.serviceUnavailable, "the session store did not answer; retry")
        }
        core.metrics.recordNotification(type: type, result: .held)
        return LocalResponse(status: .ok)
    }

    /// What a signed-in user ends themselves: their disconnect or their account.
    enum Departure {
        /// `POST /_auth/revoke`: the user disconnects Apple from the app. Their sessions and
        /// the tokens granted up to now end; the profile and the link stay (disconnecting is
        /// not deleting: the app deletes its account its own way, and a returning user is the
        /// same account). The app hears `user.revoked` (reason `disconnect`).
        case disconnect
        /// `POST /_auth/account/delete` (App Store Review Guideline 5.1.1(v)): the same, and
        /// everything the store holds of the user goes too — profile, every token, the link.
        /// The app hears `user.deleted` (reason `user_request`) and deletes its own data. A
        /// returning user is a new account.
        case deletion

        var forget: Forgetting { self == .disconnect ? .grants : .everything }
        var event: AppEventKind { self == .disconnect ? .userRevoked : .userDeleted }
        var reason: String { self == .disconnect ? "disconnect" : "user_request" }
        /// The sign-in page's message: Apple confirmed the end of the user's consent, or not.
        func message(confirmed: Bool) -> String {
            (self == .disconnect ? "disconnected" : "deleted") + (confirmed ? "" : "_here")
        }
    }

    /// A user's disconnect or deletion (`Departure`). Every refresh token the store holds for
    /// them is revoked at Apple first (a failure stays in the outbox and is retried), then their
    /// sessions end on every instance. An Apple failure never blocks the local revocation; a
    /// store failure holds it (`HeldRevocations`). A browser is told Apple no longer shares their
    /// account only when Apple confirmed it (`?message=disconnected`, `deleted`); otherwise
    /// (`disconnected_here`, `deleted_here`) where to stop it themselves. A native app (bearer)
    /// gets 204 for a disconnect, and for a deletion 200 `{"deleted": true, "apple_revoked": …}`.
    func endConsent(_ departure: Departure, _ head: HTTPRequestHead, on loop: any EventLoop) async -> LocalResponse {
        let resolution = (try? await auth.resolve(head.headers, on: loop).get()) ?? .unavailable
        guard case .session(_, let cached) = resolution else {
            if case .unavailable = resolution { return AuthResponses.storeUnavailable(head) }
            return AuthResponses.json(.unauthorized, ["error": "unauthenticated"])
        }
        let sub = cached.stored.user.sub
        let action = HeldRevocation.Action.user(sub: sub, source: .user, at: core.now(), happened: core.now(), forget: departure.forget,
                                                event: departure.event, reason: departure.reason, atApple: core.apple != nil)
        // Whether Apple confirmed the consent ended: only then does the page say so (a held
        // one, no token held, or a revocation Apple refused points to Settings instead).
        var confirmed = false
        do {
            // Done, or held until the store takes it (the tokens at Apple then too).
            try await core.revocations.durably(action, keep: auth.absoluteTimeout, on: loop) {
                confirmed = try await core.apply(action, keep: auth.absoluteTimeout, on: loop) == .applied
            }
        } catch {
            return AuthResponses.storeUnavailable(head)
        }
        let clear = auth.clearSessionCookie()
        if AuthResponses.wantsHTML(head) {
            return AuthResponses.redirect(.seeOther, to: auth.prefix + "/sign-in?message=" + departure.message(confirmed: confirmed), headers: clear)
        }
        switch departure {
        case .disconnect: return LocalResponse(status: .noContent, headers: clear + [("cache-control", "no-store")])
        case .deletion: return AuthResponses.json(.ok, ["deleted": true, "apple_revoked": confirmed], headers: clear)
        }
    }
}
