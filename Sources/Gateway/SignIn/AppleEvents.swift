import AppleID
import HTTPProxy
import NIOCore
import NIOHTTP1
import Sessions

/// What Apple tells us about a user (server-to-server notifications), and the user's own
/// disconnect.
extension AuthEndpointGuard {
    // MARK: Apple's notifications and the user's disconnect

    /// `POST /_auth/apple/notifications` (apple-sign-in.md §8.4): verified, deduplicated by
    /// `jti` across the fleet, acted on, answered 200 — also for unknown users and types, so Apple
    /// stops retrying; 400 only when the payload cannot be verified.
    func notification(body: ByteBuffer, on loop: any EventLoop) async -> LocalResponse {
        guard let apple = core.apple else { return Self.notConfigured() }
        let event: AppleNotification
        do {
            event = try await apple.notifications.verify(body: Array(body.readableBytesView))
        } catch {
            core.metrics.recordNotification(type: .unverified, result: .rejected)
            core.logger.warning("Apple notification rejected", metadata: ["reason": "\(error.rawValue)"])
            // Keys unreachable: 503 so that Apple retries; anything else can never verify.
            return error.isTransient ? .error(.serviceUnavailable, "Apple's keys are unavailable; retry") : .error(.badRequest, "unverifiable notification: \(error.rawValue)")
        }
        let type = GatewayMetrics.NotificationType(event.kind)
        do {
            if let jti = event.jti {
                // Apple redelivers: a jti is acted on once, fleet-wide (kept a week).
                let first = try await core.store.claim(.notification(jti: jti), ttl: 7 * 86_400_000, on: loop).get()
                guard first else {
                    core.metrics.recordNotification(type: type, result: .duplicate)
                    return LocalResponse(status: .ok)
                }
            }
            // When it happened (Apple's `event_time`, in whole seconds once normalized: the end of
            // that second; clamped to now): a late or retried notification never undoes what
            // happened after it.
            let eventAt = event.eventTime.map { min($0 * 1000 + 999, core.now()) }
            switch event.kind {
            case .consentRevoked:
                // A disconnect, not a deletion: the sessions created before the event end with
                // the tokens granted up to it; the profile and the link to a legacy account stay,
                // so a user who comes back is the same account. A sign-in after the event (a new
                // consent) lives on, and the app is then not told.
                _ = try await auth.revokeUser(event.subject, source: .appleNotification, at: eventAt, happened: eventAt, forget: .grants,
                                              event: (.userRevoked, "consent_revoked"), on: loop).get()
            case .accountDeleted:
                // The Apple account is gone: its `sub` can never sign in again, so every session
                // ends and everything is forgotten, whatever Apple's clock said (`event_time`
                // behind ours must not let a session survive the deletion).
                _ = try await auth.revokeUser(event.subject, source: .appleNotification, happened: eventAt, forget: .everything,
                                              event: (.userDeleted, "account_deleted"), on: loop).get()
            case .emailDisabled, .emailEnabled:
                if let profile = try await core.store.profile(of: event.subject, on: loop).get() {
                    if let applied = profile.emailEventAt, let eventAt, eventAt < applied {
                        core.logger.info("an email notification older than the last one applied: ignored", metadata: ["type": "\(type)"])
                        core.metrics.recordNotification(type: type, result: .stale)
                        return LocalResponse(status: .ok)
                    }
                    let update = UserProfile(sub: event.subject, email: event.email, privateEmail: event.isPrivateEmail,
                                             emailForwarding: event.kind == .emailEnabled ? "enabled" : "disabled", emailEventAt: eventAt)
                    try await core.store.saveProfile(update, on: loop).get()
                    core.revocations.invalidateUser(event.subject, on: loop)
                    core.events?.emit(AppEvent(kind: .emailChanged, sub: event.subject, reason: type.rawValue, happenedAt: eventAt,
                                               email: event.email ?? profile.email, emailForwarding: update.emailForwarding))
                }
            case .unknown(let name):
                core.logger.info("Apple notification of an unknown type ignored", metadata: ["type": "\(name.prefix(64))"])
            }
        } catch {
            // Answer 503 so that Apple retries, and forget the jti so the retry is processed.
            if let jti = event.jti { core.store.release(.notification(jti: jti), on: loop).whenFailure { _ in } }
            core.logger.warning("Apple notification could not be processed", metadata: ["type": "\(type)", "error": "\(error)"])
            core.metrics.recordNotification(type: type, result: .storeUnavailable)
            return .error(.serviceUnavailable, "the session store did not answer; retry")
        }
        core.metrics.recordNotification(type: type, result: .processed)
        return LocalResponse(status: .ok)
    }

    /// `POST /_auth/revoke`: the user disconnects Apple from the app. Every refresh token the
    /// store holds for them is revoked at Apple (a failure stays in the outbox and is retried),
    /// then their sessions and tokens end here and the app is told `user.revoked` (reason
    /// `disconnect`); the profile and the link stay (disconnecting is not deleting: the app
    /// deletes its account its own way, and a returning user is the same account). An Apple
    /// failure never blocks the local revocation.
    func disconnect(_ head: HTTPRequestHead, on loop: any EventLoop) async -> LocalResponse {
        let resolution = (try? await auth.resolve(head.headers, on: loop).get()) ?? .unavailable
        guard case .session(_, let cached) = resolution else {
            if case .unavailable = resolution { return AuthResponses.storeUnavailable(head) }
            return AuthResponses.json(.unauthorized, ["error": "unauthenticated"])
        }
        let sub = cached.stored.user.sub
        do {
            if core.apple != nil {
                let (queued, revoked) = try await core.revokeAtApple(sub, on: loop)
                if revoked < queued {
                    core.logger.warning("Apple did not confirm every token revocation; the rest are retried from the outbox",
                                        metadata: ["queued": .stringConvertible(queued), "revoked": .stringConvertible(revoked)])
                }
            }
            _ = try await auth.revokeUser(sub, source: .user, forget: .grants, event: (.userRevoked, "disconnect"), on: loop).get()
        } catch {
            return AuthResponses.storeUnavailable(head)
        }
        let clear = auth.clearCookie(auth.cookieName)
        return AuthResponses.wantsHTML(head)
            ? AuthResponses.redirect(.seeOther, to: auth.prefix + "/sign-in?message=disconnected", headers: [clear])
            : LocalResponse(status: .noContent, headers: [clear, ("cache-control", "no-store")])
    }
}
