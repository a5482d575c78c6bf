import Logging
import NIOCore
import Sessions

/// Ending sessions and users, here and on every instance: revocations (with their events for
/// the app and their metric), logouts, invalidations, and the tunnels they close. The one
/// revocation path: the endpoints, the revalidator and the `sessions revoke` command all call it.
final class Revocations: Sendable {
    /// Why sessions ended (a metric label).
    enum Source: String, CaseIterable, Sendable, Codable {
        case appleNotification = "apple_notification", user, appleInvalidGrant = "apple_invalid_grant", operator_ = "operator"
    }

    let store: any SessionStore
    /// What the store did not take, kept until it does (`HeldRevocations`).
    let held: HeldRevocations
    let cache: LocalSessionCache<CachedSession>
    let fleet: FleetPublisher
    let tunnels: TunnelRegistry
    let events: AppEvents?
    let metrics: GatewayMetrics
    let logger: Logger
    let now: @Sendable () -> Int64
    /// Where tunnel checks after an invalidation run.
    let backgroundLoop: any EventLoop

    init(store: any SessionStore, held: HeldRevocations, cache: LocalSessionCache<CachedSession>, fleet: FleetPublisher, tunnels: TunnelRegistry, events: AppEvents?,
         metrics: GatewayMetrics, logger: Logger, now: @escaping @Sendable () -> Int64, backgroundLoop: any EventLoop) {
        self.store = store
        self.held = held
        self.cache = cache
        self.fleet = fleet
        self.tunnels = tunnels
        self.events = events
        self.metrics = metrics
        self.logger = logger
        self.now = now
        self.backgroundLoop = backgroundLoop
    }

    /// Revokes a user: `revoked_at` recorded (kept for `keep` ms: the absolute session timeout),
    /// the sessions created up to it deleted, then the user dropped from this instance's cache
    /// and from every other instance's through pub/sub.
    /// - Parameters:
    ///   - at: what the revocation reaches: sessions and grants up to this time (a notification's
    ///     `event_time`, the grant time of a token Apple refused), clamped to now. A session or
    ///     token from after it (the user came back) lives on, and the app is then not told (the
    ///     revocation concerned an older grant) — unless everything is forgotten.
    ///   - happened: when it happened, the event's `event_time` (Apple's for a notification);
    ///     nil: now.
    ///   - forget: what goes besides the sessions (`Forgetting`).
    ///   - event: what the app is told, and why (`events.url`).
    ///   - clients: only the sessions and tokens of these client ids (one app group's consent);
    ///     nil: all of the user's.
    func revokeUser(_ sub: String, source: Source, at: Int64? = nil, happened: Int64? = nil, keep: Int64, forget: Forgetting = .nothing,
                    clients: Set<String>? = nil, event: (kind: AppEventKind, reason: String)? = nil, on loop: any EventLoop) -> EventLoopFuture<Revocation> {
        // The cache is dropped once the store took it: until then a failed write leaves the
        // sessions cached, for `HeldRevocations` to refuse without asking the store.
        let t = now()
        let revokedAt = min(at ?? t, t)
        // What its sessions' clients are told (`SessionEnd`): a deletion, or a revocation.
        let end: SessionEnd = event?.kind == .userDeleted || (event == nil && forget == .everything) ? .deleted : .revoked
        return store.revoke(sub, at: revokedAt, keep: keep, forget: forget, end: end, clients: clients, on: loop).map { outcome in
            self.cache.invalidate(sub: sub)
            self.fleet.publish(.user(sub), on: loop)
            self.recheck(self.tunnels.tunnels(of: sub))
            self.metrics.recordRevocation(source: source)
            if outcome.superseded, forget != .everything {
                self.logger.info("a revocation older than the user's latest sign-in: the older sessions ended, the app is not told",
                                 metadata: ["sub": "\(sub)", "source": "\(source.rawValue)", "sessions": .stringConvertible(outcome.ended)])
                return outcome
            }
            let (kind, reason) = event ?? (.userRevoked, source.rawValue)
            self.events?.emit(AppEvent(kind: kind, sub: sub, reason: reason, happenedAt: happened.map { min($0, t) } ?? t))
            self.logger.info("user revoked", metadata: ["sub": "\(sub)", "source": "\(source.rawValue)", "sessions": .stringConvertible(outcome.ended), "forgotten": "\(forget)"])
            return outcome
        }
    }

    /// Does `action` (`apply`, by default `apply(_:keep:on:)`), or holds it when the store
    /// fails (`HeldRevocations`: refused here at once, applied when the store answers): the
    /// caller answers success either way. Throws the store's error only when it could not be
    /// held either (the queue full, the journal unwritable).
    func durably(_ action: HeldRevocation.Action, keep: Int64, on loop: any EventLoop,
                 apply: (() async throws -> Void)? = nil) async throws {
        do {
            if let apply { try await apply() } else { try await self.apply(action, keep: keep, on: loop) }
        } catch {
            guard await hold(action, keep: keep, why: error) else { throw error }
        }
    }

    /// Holds what the store did not take (`HeldRevocations.hold`); once held, its tunnels end
    /// (a tunnel is not admitted again: the held denial cannot reach it).
    func hold(_ action: HeldRevocation.Action, keep: Int64, why: any Error) async -> Bool {
        guard await held.hold(action, keep: keep, why: why) else { return false }
        switch action.deny {
        case .user(let sub, _): tunnels.tunnels(of: sub).forEach { $0.lease.end() }
        case .session(let key): tunnels.tunnels(ofSession: key).forEach { $0.lease.end() }
        case nil: break
        }
        return true
    }

    /// A logout or a user's revocation, applied to the store (live, or replayed from
    /// `HeldRevocations`); the disconnect's tokens at Apple and the email changes are
    /// `AuthCore.apply`'s.
    func apply(_ action: HeldRevocation.Action, keep: Int64, on loop: any EventLoop) async throws {
        switch action {
        case .user(let sub, let source, let at, let happened, let forget, let event, let reason, _, let clients):
            _ = try await revokeUser(sub, source: source, at: at, happened: happened, keep: keep, forget: forget, clients: clients.map(Set.init),
                                     event: event.map { ($0, reason ?? source.rawValue) }, on: loop).get()
        case .session(let key, let sub):
            // The session the store holds under the key, if any (gone already: nothing to end).
            guard let handle = SessionHandle(key: key, sub: sub), let stored = try await store.load(handle, on: loop).get() else { return }
            try await endSession(handle, sub: stored.session.sub, reason: .logout, keep: keep, on: loop).get()
        case .email, .notification:
            throw HeldRevocations.NotApplicable()
        }
    }

    /// Drops a user's cached sessions everywhere, e.g. after their profile changed.
    func invalidateUser(_ sub: String, on loop: any EventLoop) {
        cache.invalidate(sub: sub)
        fleet.publish(.user(sub), on: loop)
    }

    /// Ends one session (logout) here and on every instance; its client is told `signed_out`
    /// while it could present it (`keep`: the absolute timeout).
    func endSession(_ handle: SessionHandle, sub: String, reason: GatewayMetrics.SessionEndReason, keep: Int64, on loop: any EventLoop) -> EventLoopFuture<Void> {
        cache.invalidate(handle)
        return store.delete(handle, sub: sub, end: .signedOut, keep: keep, on: loop).map {
            self.events?.emit(AppEvent(kind: .sessionEnded, sub: sub, reason: reason.rawValue, session: String(handle.key.prefix(12))))
            self.fleet.publish(.session(handle), on: loop)
            self.recheck(self.tunnels.tunnels(ofSession: handle.key))
        }
    }

    /// An invalidation from another instance (or this one): the local cache forgets it, and
    /// the tunnels it names are checked.
    func received(_ message: FleetMessage) {
        switch message {
        case .user(let sub): cache.invalidate(sub: sub)
        case .session(let handle): cache.invalidate(handle)
        case .validated: return
        }
        metrics.invalidationsReceived.increment()
        guard tunnels.count > 0 else { return }
        switch message {
        case .user(let sub): recheck(tunnels.tunnels(of: sub))
        case .session(let handle): recheck(tunnels.tunnels(ofSession: handle.key))
        case .validated: break
        }
    }

    /// After the subscriber (re)connected: messages may have been missed meanwhile. The cache
    /// forgets everything, and every open tunnel's session is checked in the store again.
    func resubscribed() {
        cache.flush()
        guard tunnels.count > 0 else { return }
        recheck(tunnels.all)
    }

    /// Ends each tunnel whose session is gone, revoked or expired (by the lifetimes of the
    /// configuration that admitted it). A store that does not answer ends nothing (a
    /// dependency failure never ends a session).
    private func recheck(_ entries: [TunnelRegistry.Entry]) {
        let loop = backgroundLoop
        for entry in entries {
            store.load(entry.handle, on: loop).whenSuccess { stored in
                guard let stored, entry.times.isLive(stored, now: self.now()) else {
                    self.logger.info("WebSocket tunnel closed: its session ended")
                    return entry.lease.end()
                }
            }
        }
    }
}
