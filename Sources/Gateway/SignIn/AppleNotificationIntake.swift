import AppleID
import NIOCore
import Sessions

/// What became of one notification from Apple (`AuthCore.takeNotification`).
enum NotificationTaken {
    /// Acted on, or nothing to do (a duplicate, a stale email change, an unknown user or type).
    case taken
    /// It can never verify (malformed, forged, not ours): 400.
    case unverifiable(AppleTokenRejection)
    /// Apple's keys did not answer: it is verified later.
    case keysUnavailable(AppleTokenRejection)
    /// Verified, but the store did not take what it says; `deny`: what this instance refuses
    /// until it does.
    case storeFailed(GatewayMetrics.NotificationType, deny: HeldRevocation.Deny?, any Error)
}

extension AuthCore {
    /// Verifies one notification body, claims its `jti` (Apple redelivers: a `jti` is acted on
    /// once, fleet-wide, kept a week) and acts on it — the endpoint's first attempt and a held
    /// one's replay alike. `claimedBefore`: an earlier attempt got past verification, so the
    /// claim may be its own; the notification is acted on whatever the claim says.
    /// - Parameter keep: how long a revocation is kept (the absolute session timeout).
    func takeNotification(_ body: [UInt8], claimedBefore: Bool, keep: Int64, on loop: any EventLoop) async -> NotificationTaken {
        guard let apple else { return .unverifiable(.malformed) }
        let event: AppleNotification
        do {
            event = try await apple.notifications.verify(body: body)
        } catch {
            if error.isTransient { return .keysUnavailable(error) }
            metrics.recordNotification(type: .unverified, result: .rejected)
            logger.warning("Apple notification rejected", metadata: ["reason": "\(error.rawValue)"])
            return .unverifiable(error)
        }
        let type = GatewayMetrics.NotificationType(event.kind)
        // When it happened (Apple's `event_time`, in whole seconds once normalized: the end of
        // that second; clamped to now): a late or retried notification never undoes what
        // happened after it.
        let eventAt = event.eventTime.map { min($0 * 1000 + 999, now()) }
        let deny: HeldRevocation.Deny? = switch event.kind {
        case .consentRevoked: .user(sub: event.subject, upTo: eventAt ?? now())
        case .accountDeleted: .user(sub: event.subject, upTo: .max)
        case .emailDisabled, .emailEnabled, .unknown: nil
        }
        do {
            if let jti = event.jti {
                let first = try await store.claim(.notification(jti: jti), ttl: 7 * 86_400_000, on: loop).get()
                guard first || claimedBefore else {
                    metrics.recordNotification(type: type, result: .duplicate)
                    return .taken
                }
            }
            switch event.kind {
            case .consentRevoked:
                // A disconnect, not a deletion: the sessions created before the event end with
                // the tokens granted up to it; the profile and the link to a legacy account stay,
                // so a user who comes back is the same account. A sign-in after the event (a new
                // consent) lives on, and the app is then not told.
                _ = try await revocations.revokeUser(event.subject, source: .appleNotification, at: eventAt, happened: eventAt, keep: keep, forget: .grants,
                                                     event: (.userRevoked, "consent_revoked"), on: loop).get()
            case .accountDeleted:
                // The Apple account is gone: its `sub` can never sign in again, so every session
                // ends and everything is forgotten, whatever Apple's clock said (`event_time`
                // behind ours must not let a session survive the deletion).
                _ = try await revocations.revokeUser(event.subject, source: .appleNotification, happened: eventAt, keep: keep, forget: .everything,
                                                     event: (.userDeleted, "account_deleted"), on: loop).get()
            case .emailDisabled, .emailEnabled:
                if let profile = try await store.profile(of: event.subject, on: loop).get() {
                    if let applied = profile.emailEventAt, let eventAt, eventAt < applied {
                        logger.info("an email notification older than the last one applied: ignored", metadata: ["type": "\(type)"])
                        metrics.recordNotification(type: type, result: .stale)
                        return .taken
                    }
                    let update = UserProfile(sub: event.subject, email: event.email, privateEmail: event.isPrivateEmail,
                                             emailForwarding: event.kind == .emailEnabled ? "enabled" : "disabled", emailEventAt: eventAt)
                    try await store.saveProfile(update, on: loop).get()
                    revocations.invalidateUser(event.subject, on: loop)
                    events?.emit(AppEvent(kind: .emailChanged, sub: event.subject, reason: type.rawValue, happenedAt: eventAt,
                                          email: event.email ?? profile.email, emailForwarding: update.emailForwarding))
                }
            case .unknown(let name):
                logger.info("Apple notification of an unknown type ignored", metadata: ["type": "\(name.prefix(64))"])
            }
        } catch {
            // Forget the jti (when the store answers that) so that the replay is not a duplicate.
            if let jti = event.jti { store.release(.notification(jti: jti), on: loop).whenFailure { _ in } }
            logger.warning("Apple notification could not be processed", metadata: ["type": "\(type)", "error": "\(error)"])
            return .storeFailed(type, deny: deny, error)
        }
        metrics.recordNotification(type: type, result: .processed)
        return .taken
    }

    /// Applies one held revocation again (`HeldRevocations.replay`): a notification from the
    /// start, a disconnect's tokens queued for Apple before the user's revocation, the rest
    /// `Revocations.apply`.
    func replay(_ entry: HeldRevocation, on loop: any EventLoop) async -> HeldRevocations.Applied {
        switch entry.action {
        case .notification(let body, let verified):
            switch await takeNotification(Array(body.utf8), claimedBefore: verified, keep: entry.keep, on: loop) {
            case .taken: return .done
            case .unverifiable: return .drop
            case .keysUnavailable: return .later
            case .storeFailed: return .retry
            }
        case .user(let sub, _, _, _, _, _, _, let atApple):
            do {
                if atApple, apple != nil { _ = try await revokeAtApple(sub, on: loop) }
                _ = try await revocations.apply(entry.action, keep: entry.keep, on: loop)
                return .done
            } catch {
                return .retry
            }
        case .session:
            return (try? await revocations.apply(entry.action, keep: entry.keep, on: loop)) == nil ? .retry : .done
        }
    }
}
