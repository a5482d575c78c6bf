import NIOCore
import Sessions

/// Ending sessions and users, here and on every instance: revocations (with their events for
/// the app), logouts, the fleet's messages, and the tunnels a revocation closes.
extension AuthCore {
    /// Why sessions ended (a metric label).
    enum RevocationSource: String, CaseIterable {
        case appleNotification = "apple_notification", user, appleInvalidGrant = "apple_invalid_grant"
    }

    /// Revokes a user: `revoked_at` recorded (kept for the absolute session timeout), the
    /// sessions created up to it deleted, the user dropped from this instance's cache at once and
    /// from every other instance's through pub/sub.
    /// - Parameters:
    ///   - at: when the revocation happened (a notification's `event_time`), clamped to now; a
    ///     session created after it (the user signed in again) lives on.
    ///   - forget: delete the profile and stored refresh tokens too (account deleted, consent
    ///     revoked, the user's own disconnect).
    ///   - event: what the app is told, and why (`events.url`).
    func revokeUser(_ sub: String, source: RevocationSource, at: Int64? = nil, forget: Bool = false,
                    event: (kind: AppEventKind, reason: String)? = nil, on loop: any EventLoop) -> EventLoopFuture<Int> {
        cache.invalidate(sub: sub)
        let t = now()
        let revokedAt = min(at ?? t, t)
        let keep = times.withLockedValue { $0.absolute }
        return withDeadline(store.revoke(sub, at: revokedAt, keep: keep, forget: forget, on: loop), on: loop).map { count in
            self.cache.invalidate(sub: sub)
            self.publish(.user(sub), on: loop)
            self.recheckTunnels(self.tunnels.tunnels(of: sub))
            self.metrics.recordRevocation(source: source)
            let (kind, reason) = event ?? (.userRevoked, source.rawValue)
            self.events?.emit(AppEvent(kind: kind, sub: sub, reason: reason))
            self.logger.info("user revoked", metadata: ["sub": "\(sub)", "source": "\(source.rawValue)", "sessions": "\(count)", "forgotten": "\(forget)"])
            return count
        }
    }

    /// Queues every refresh token the store holds for the user (their sessions' and the ones kept
    /// per client) for revocation at Apple, and tries them now (bounded by `apple.timeout` each).
    /// Answers how many were queued and how many Apple confirmed; the rest stay in the outbox and
    /// are retried until Apple answers.
    func revokeAtApple(_ sub: String, on loop: any EventLoop) async throws -> (queued: Int, revoked: Int) {
        let ids = try await store.queueAppleRevocations(of: sub, now: now(), keys: keys, on: loop)
        let done = await outbox.runDue(only: Set(ids))
        return (ids.count, done.count)
    }

    /// Drops a user's cached sessions everywhere, e.g. after their profile changed.
    func invalidateUser(_ sub: String, on loop: any EventLoop) {
        cache.invalidate(sub: sub)
        publish(.user(sub), on: loop)
    }

    /// Ends one session (logout) here and on every instance.
    func endSession(_ handle: SessionHandle, sub: String, reason: GatewayMetrics.SessionEndReason, on loop: any EventLoop) -> EventLoopFuture<Void> {
        cache.invalidate(handle)
        return withDeadline(store.delete(handle, sub: sub, on: loop), on: loop).map {
            self.events?.emit(AppEvent(kind: .sessionEnded, sub: sub, reason: reason.rawValue, session: String(handle.key.prefix(12))))
            self.publish(.session(handle), on: loop)
            self.recheckTunnels(self.tunnels.tunnels(ofSession: handle.key))
        }
    }

    /// After an invalidation message: the tunnels it names are checked.
    func recheckTunnels(_ message: FleetMessage) {
        guard tunnels.count > 0 else { return }
        switch message {
        case .user(let sub): recheckTunnels(tunnels.tunnels(of: sub))
        case .session(let handle): recheckTunnels(tunnels.tunnels(ofSession: handle.key))
        case .validated: break
        }
    }

    /// After the subscriber (re)connected: a revocation published meanwhile reached no one here.
    func recheckAllTunnels() {
        guard tunnels.count > 0 else { return }
        recheckTunnels(tunnels.all)
    }

    /// Ends each tunnel whose session is gone, revoked or expired. A store that does not answer
    /// ends nothing (a dependency failure never ends a session).
    private func recheckTunnels(_ entries: [TunnelRegistry.Entry]) {
        let loop = backgroundLoop
        for entry in entries {
            withDeadline(store.load(entry.handle, on: loop), on: loop).whenSuccess { stored in
                guard let stored, self.times.withLockedValue({ $0 }).isLive(stored, now: self.now()) else {
                    self.logger.info("WebSocket tunnel closed: its session ended")
                    return entry.lease.end()
                }
            }
        }
    }

    func publish(_ message: FleetMessage, on loop: any EventLoop) {
        backend?.publish(message, on: loop).whenFailure { error in
            self.logger.warning("could not publish to the other instances; they catch up within store.local_cache_ttl (a validation waiter within its lock's TTL)",
                                metadata: ["error": "\(error)"])
        }
    }

    /// An invalidation from another instance (or this one): the local cache forgets it.
    static func apply(_ message: FleetMessage, to cache: LocalSessionCache<CachedSession>, metrics: GatewayMetrics) {
        switch message {
        case .user(let sub): cache.invalidate(sub: sub)
        case .session(let handle): cache.invalidate(handle)
        case .validated: return
        }
        metrics.invalidationsReceived.increment()
    }
}
