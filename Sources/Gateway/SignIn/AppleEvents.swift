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
            case .consentRevoked, .accountDeleted:
                // The sessions created before the event, with their sealed refresh tokens, and
                // the profile are deleted; a sign-in after the event lives on.
                let told: (AppEventKind, String) = event.kind == .accountDeleted ? (.userDeleted, "account_deleted") : (.userRevoked, "consent_revoked")
                _ = try await auth.revokeUser(event.subject, source: .appleNotification, at: eventAt, forget: true, event: told, on: loop).get()
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
                    core.events?.emit(AppEvent(kind: .emailChanged, sub: event.subject, reason: type.rawValue, email: event.email ?? profile.email,
                                                    emailForwarding: update.emailForwarding))
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

    /// `POST /_auth/revoke`: the user disconnects Apple (or deletes their account). Every refresh
    /// token the store holds for them is revoked at Apple (a failure stays in the outbox and is
    /// retried until Apple answers), then the user is revoked and forgotten here; an Apple
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
                                        metadata: ["queued": "\(queued)", "revoked": "\(revoked)"])
                }
            }
            _ = try await auth.revokeUser(sub, source: .user, forget: true, event: (.userDeleted, "user"), on: loop).get()
        } catch {
            return AuthResponses.storeUnavailable(head)
        }
        let clear = auth.clearCookie(auth.cookieName)
        return AuthResponses.wantsHTML(head)
            ? AuthResponses.redirect(.seeOther, to: auth.prefix + "/sign-in?message=disconnected", headers: [clear])
            : LocalResponse(status: .noContent, headers: [clear, ("cache-control", "no-store")])
    }
}
