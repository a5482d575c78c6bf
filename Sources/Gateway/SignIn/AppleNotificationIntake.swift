import AppleID
import NIOCore
import Sessions

/// What became of one notification from Apple (`AuthCore.takeNotification`).
enum NotificationTaken {
    /// Acted on, or nothing to do (a duplicate, a stale email change, an unknown user or type).
    case taken
    /// It can never verify (malformed, forged, not ours): 400.
    case unverifiable(AppleTokenRejection)
    /// Apple's keys did not answer: it is held as posted, and verified later.
    case keysUnavailable(AppleTokenRejection)
    /// Verified, but the store did not take what it says: `action`, to be held.
    case storeFailed(GatewayMetrics.NotificationType, HeldRevocation.Action, any Error)
}

extension AuthCore {
    /// Verifies one notification body and says what it asks for: the held action (nil: an
    /// unknown type, nothing to do), its kind and `jti`. `received`: when it reached us (a held
    /// one's), the time of a revocation Apple's event does not date (default now).
    func verifyNotification(_ body: [UInt8], received: Int64? = nil) async -> Result<(AppleNotification, HeldRevocation.Action?), AppleTokenRejection> {
        guard let apple else { return .failure(.malformed) }
        let event: AppleNotification
        do {
            event = try await apple.notifications.verify(body: body)
        } catch {
            return .failure(error)
        }
        // When it happened (Apple's `event_time`, in whole seconds once normalized: the end of
        // that second; clamped to now): a late or retried notification never undoes what
        // happened after it.
        let eventAt = event.eventTime.map { min($0 * 1000 + 999, now()) }
        let at = received ?? now()
        let action: HeldRevocation.Action? = switch event.kind {
        case .consentRevoked:
            // A disconnect, not a deletion: the sessions created before the event end with the
            // tokens granted up to it; the profile and the link to a legacy account stay, so a
            // user who comes back is the same account. A sign-in after the event (a new
            // consent) lives on, and the app is then not told.
            // Consent is per app group: the notification names the group's primary App ID, and
            // only that group's sessions and tokens end (all of them with one group).
            .user(sub: event.subject, source: .appleNotification, at: eventAt ?? at, happened: eventAt, forget: .grants,
                  event: .userRevoked, reason: "consent_revoked", atApple: false, clients: apple.appGroup(of: event.audience))
        case .accountDeleted:
            // The Apple account is gone: its `sub` can never sign in again, so every session
            // ends and everything is forgotten, whatever Apple's clock said (`event_time` behind
            // ours must not let a session survive the deletion).
            .user(sub: event.subject, source: .appleNotification, at: at, happened: eventAt, forget: .everything,
                  event: .userDeleted, reason: "account_deleted", atApple: false)
        case .emailDisabled, .emailEnabled:
            .email(sub: event.subject, email: event.email, privateEmail: event.isPrivateEmail, enabled: event.kind == .emailEnabled, at: eventAt)
        case .unknown(let name):
            { logger.info("Apple notification of an unknown type ignored", metadata: ["type": "\(name.prefix(64))"]); return nil }()
        }
        return .success((event, action))
    }

    /// One notification from Apple: verified, its `jti` claimed (Apple redelivers: a `jti` is
    /// acted on once, fleet-wide, kept a week), acted on.
    /// - Parameter keep: how long a revocation is kept (the absolute session timeout).
    func takeNotification(_ body: [UInt8], keep: Int64, on loop: any EventLoop) async -> NotificationTaken {
        let event: AppleNotification
        let action: HeldRevocation.Action?
        switch await verifyNotification(body) {
        case .failure(let error) where error.isTransient:
            return .keysUnavailable(error)
        case .failure(let error):
            metrics.recordNotification(type: .unverified, result: .rejected)
            logger.warning("Apple notification rejected", metadata: ["reason": "\(error.rawValue)"])
            return .unverifiable(error)
        case .success(let verified):
            (event, action) = verified
        }
        let type = GatewayMetrics.NotificationType(event.kind)
        guard let action else {
            metrics.recordNotification(type: type, result: .processed)
            return .taken
        }
        do {
            if let jti = event.jti {
                guard try await store.claim(.notification(jti: jti), ttl: 7 * 86_400_000, on: loop).get() else {
                    metrics.recordNotification(type: type, result: .duplicate)
                    return .taken
                }
            }
            if try await apply(action, keep: keep, on: loop) == .stale {
                metrics.recordNotification(type: type, result: .stale)
                return .taken
            }
        } catch {
            // Held as what it says (applied without a claim: it is idempotent); the jti released
            // when the store answers that, so that Apple's redelivery is acted on too.
            if let jti = event.jti { store.release(.notification(jti: jti), on: loop).whenFailure { _ in } }
            logger.warning("Apple notification could not be processed", metadata: ["type": "\(type)", "error": "\(error)"])
            return .storeFailed(type, action, error)
        }
        metrics.recordNotification(type: type, result: .processed)
        return .taken
    }

    /// What `apply` did: applied, or nothing (an email change older than the last one applied).
    /// `appleUnconfirmed`: a disconnect done here, but Apple has not confirmed the end of the
    /// user's consent (no token was held, or a revocation failed and waits in the outbox).
    enum Effect: Equatable { case applied, stale, appleUnconfirmed }

    /// Does one revocation (live, or replayed from `HeldRevocations`): a disconnect's tokens at
    /// Apple first (those granted up to it), a user's revocation or a logout (`Revocations`),
    /// an email change from Apple (`stale`: older than the last one applied).
    func apply(_ action: HeldRevocation.Action, keep: Int64, on loop: any EventLoop) async throws -> Effect {
        switch action {
        case .user(let sub, _, let at, _, _, _, _, let atApple, _):
            var confirmed = true
            if atApple, apple != nil {
                let (queued, revoked) = try await revokeAtApple(sub, upTo: at, on: loop)
                if revoked < queued {
                    logger.warning("Apple did not confirm every token revocation; the rest are retried from the outbox",
                                   metadata: ["queued": .stringConvertible(queued), "revoked": .stringConvertible(revoked)])
                }
                confirmed = queued > 0 && revoked == queued
            }
            try await revocations.apply(action, keep: keep, on: loop)
            if !confirmed { return .appleUnconfirmed }
        case .session:
            try await revocations.apply(action, keep: keep, on: loop)
        case .email(let sub, let email, let privateEmail, let enabled, let at):
            // An unknown user: nothing to update.
            guard let profile = try await store.profile(of: sub, on: loop).get() else { return .applied }
            if let applied = profile.emailEventAt, let at, at < applied {
                logger.info("an email notification older than the last one applied: ignored")
                return .stale
            }
            let update = UserProfile(sub: sub, email: email, privateEmail: privateEmail, emailForwarding: enabled ? "enabled" : "disabled", emailEventAt: at)
            try await store.saveProfile(update, on: loop).get()
            revocations.invalidateUser(sub, on: loop)
            events?.emit(AppEvent(kind: .emailChanged, sub: sub, reason: enabled ? "email-enabled" : "email-disabled", happenedAt: at,
                                  email: email ?? profile.email, emailForwarding: update.emailForwarding))
        case .notification:
            throw HeldRevocations.NotApplicable()
        }
        return .applied
    }

    /// Applies one held revocation again (`HeldRevocations.replay`); a notification not verified
    /// yet is verified first, then held as what it says.
    func replay(_ entry: HeldRevocation, on loop: any EventLoop) async -> HeldRevocations.Applied {
        if case .notification(let body) = entry.action {
            switch await verifyNotification(Array(body.utf8), received: entry.received) {
            case .failure(let error) where error.isTransient: return .later
            case .failure: return .drop
            case .success((_, nil)): return .done
            case .success((_, let action?)): return .replace(action)
            }
        }
        do {
            _ = try await apply(entry.action, keep: entry.keep, on: loop)
            return .done
        } catch {
            return .retry
        }
    }
}
