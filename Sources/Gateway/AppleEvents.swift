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
        guard let apple = auth.apple else { return Self.notConfigured() }
        let event: AppleNotification
        do {
            event = try await apple.notifications.verify(body: Array(body.readableBytesView))
        } catch {
            auth.metrics.recordNotification(type: "unverified", result: "rejected")
            auth.logger.warning("Apple notification rejected", metadata: ["reason": "\(error.rawValue)"])
            // Keys unreachable: 503 so that Apple retries; anything else can never verify.
            return error.isTransient ? .error(.serviceUnavailable, "Apple's keys are unavailable; retry") : .error(.badRequest, "unverifiable notification: \(error.rawValue)")
        }
        let type: String
        switch event.kind {
        case .emailDisabled: type = "email-disabled"
        case .emailEnabled: type = "email-enabled"
        case .consentRevoked: type = "consent-revoked"
        case .accountDeleted: type = "account-deleted"
        case .unknown: type = "unknown"
        }
        do {
            if let jti = event.jti {
                // Apple redelivers: a jti is acted on once, fleet-wide (kept a week).
                let first = try await auth.store(on: loop).claim(.notification(jti: jti), ttl: 7 * 86_400_000)
                guard first else {
                    auth.metrics.recordNotification(type: type, result: "duplicate")
                    return LocalResponse(status: .ok)
                }
            }
            switch event.kind {
            case .consentRevoked, .accountDeleted:
                // Sessions, and with them the sealed refresh tokens, are deleted.
                _ = try await auth.revokeUser(event.subject, source: .appleNotification, on: loop).get()
            case .emailDisabled, .emailEnabled:
                let known = try await auth.store(on: loop).profile(of: event.subject) != nil
                if known {
                    let update = UserProfile(sub: event.subject, email: event.email, privateEmail: event.isPrivateEmail,
                                             emailForwarding: event.kind == .emailEnabled ? "enabled" : "disabled")
                    try await auth.store(on: loop).saveProfile(update)
                    auth.invalidateUser(event.subject, on: loop)
                }
            case .unknown(let name):
                auth.logger.info("Apple notification of an unknown type ignored", metadata: ["type": "\(name.prefix(64))"])
            }
        } catch {
            // Answer 503 so that Apple retries, and forget the jti so the retry is processed.
            if let jti = event.jti { auth.store.release(.notification(jti: jti), on: loop).whenFailure { _ in } }
            auth.logger.warning("Apple notification could not be processed", metadata: ["type": "\(type)", "error": "\(error)"])
            auth.metrics.recordNotification(type: type, result: "store_unavailable")
            return .error(.serviceUnavailable, "the session store did not answer; retry")
        }
        auth.metrics.recordNotification(type: type, result: "processed")
        return LocalResponse(status: .ok)
    }

    /// `POST /_auth/revoke`: the user disconnects Apple (or deletes their account). Each stored
    /// refresh token is revoked at Apple, then the user is revoked here; an Apple failure never
    /// blocks the local revocation.
    func disconnect(_ head: HTTPRequestHead, on loop: any EventLoop) async -> LocalResponse {
        let resolution = (try? await auth.resolve(head.headers, on: loop).get()) ?? .unavailable
        guard case .session(_, let cached) = resolution else {
            if case .unavailable = resolution { return AuthResponses.storeUnavailable(head) }
            return AuthResponses.json(.unauthorized, ["error": "unauthenticated"])
        }
        let sub = cached.stored.user.sub
        if let apple = auth.apple, let sessions = try? await auth.store(on: loop).sessions(of: sub) {
            for session in sessions {
                guard let sealed = session.sealedRefreshToken, let token = auth.keys.open(sealed, for: session.handle) else { continue }
                let outcome = await auth.metrics.timeAppleCall("revoke") { await apple.tokens.revoke(token: token, isRefreshToken: true, clientID: session.clientID) }
                auth.metrics.recordAppleCall(endpoint: "revoke", outcome: outcome == .revoked ? "ok" : "failed")
                if outcome != .revoked {
                    auth.logger.warning("Apple did not confirm a token revocation; the local revocation proceeds", metadata: ["outcome": "\(outcome)"])
                }
            }
        }
        do {
            _ = try await auth.revokeUser(sub, source: .user, on: loop).get()
        } catch {
            return AuthResponses.storeUnavailable(head)
        }
        let clear = auth.clearCookie(auth.cookieName)
        return AuthResponses.wantsHTML(head)
            ? AuthResponses.redirect(.seeOther, to: auth.prefix + "/sign-in?message=disconnected", headers: [clear])
            : LocalResponse(status: .noContent, headers: [clear, ("cache-control", "no-store")])
    }
}
