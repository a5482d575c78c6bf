import NIOCore
import Prometheus
import Sessions

/// The session store as the gateway reaches it, whichever backend is underneath: every
/// operation timed into `sessiongate_store_duration_seconds` under its `StoreOperation`, and
/// answered within `store.timeout` or failed with `SessionStoreError` (a keyspace walk is bounded
/// per round trip only). It is the one way to the store: the hot path chains its futures on the
/// event loop, async code awaits them with `.get()`; neither bridges a deadline itself.
struct GatewayStore: SessionStore {
    let base: any SessionStore
    let timeout: TimeAmount
    private let latency: [StoreOperation: DurationHistogram]
    /// `tracing` is on: operations look for the trace they run in. Off, not even that.
    private let traced: Bool

    init(_ base: any SessionStore, timeout: TimeAmount, metrics: GatewayMetrics, traced: Bool = false) {
        self.base = base
        self.timeout = timeout
        self.traced = traced
        latency = Dictionary(uniqueKeysWithValues: StoreOperation.allCases.map { ($0, metrics.storeLatency($0)) })
    }

    /// Async work in a trace (`TraceScope`) records a span per operation; the admission path,
    /// on an event loop, makes its own (`OpenSpan.store`).
    private func run<T: Sendable>(_ operation: StoreOperation, on loop: any EventLoop, _ future: EventLoopFuture<T>) -> EventLoopFuture<T> {
        if traced, let scope = TraceScope.current { OpenSpan.store(operation, tracer: scope.tracer, parent: scope.context)?.end(with: future) }
        let start = NIODeadline.now()
        let histogram = latency[operation]
        future.whenComplete { _ in histogram?.recordNanoseconds(Int64(NIODeadline.now().uptimeNanoseconds - start.uptimeNanoseconds)) }
        guard !operation.walksKeyspace else { return future.hop(to: loop) }
        return Self.bounded(future, within: timeout, on: loop)
    }

    /// `future`, or a `SessionStoreError` when it has not completed within `timeout`.
    /// Completes on `loop`.
    static func bounded<T: Sendable>(_ future: EventLoopFuture<T>, within timeout: TimeAmount, on loop: any EventLoop) -> EventLoopFuture<T> {
        let promise = loop.makePromise(of: T.self)
        let timer = loop.scheduleTask(in: timeout) { promise.fail(SessionStoreError("no answer within store.timeout", fault: .timeout)) }
        future.whenComplete { result in
            timer.cancel()
            promise.completeWith(result)
        }
        return promise.futureResult
    }

    func create(_ session: SessionRecord, profile: UserProfile, expiresAt: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.create, on: eventLoop, base.create(session, profile: profile, expiresAt: expiresAt, on: eventLoop))
    }
    func load(_ handle: SessionHandle, on eventLoop: any EventLoop) -> EventLoopFuture<StoredSession?> {
        run(.load, on: eventLoop, base.load(handle, on: eventLoop))
    }
    func touch(_ handle: SessionHandle, lastSeen: Int64, expiresAt: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.touch, on: eventLoop, base.touch(handle, lastSeen: lastSeen, expiresAt: expiresAt, on: eventLoop))
    }
    func delete(_ handle: SessionHandle, sub: String, end: SessionEnd, keep: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.delete, on: eventLoop, base.delete(handle, sub: sub, end: end, keep: keep, on: eventLoop))
    }
    func sessions(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<[SessionRecord]> {
        run(.sessions, on: eventLoop, base.sessions(of: sub, on: eventLoop))
    }
    func end(of handle: SessionHandle, on eventLoop: any EventLoop) -> EventLoopFuture<SessionEnd?> {
        run(.end, on: eventLoop, base.end(of: handle, on: eventLoop))
    }
    func revoke(_ sub: String, at revokedAt: Int64, keep: Int64, forget: Forgetting, end: SessionEnd, clients: Set<String>?,
                on eventLoop: any EventLoop) -> EventLoopFuture<Revocation> {
        run(.revoke, on: eventLoop, base.revoke(sub, at: revokedAt, keep: keep, forget: forget, end: end, clients: clients, on: eventLoop))
    }
    func saveProfile(_ profile: UserProfile, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.saveProfile, on: eventLoop, base.saveProfile(profile, on: eventLoop))
    }
    func profile(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<UserProfile?> {
        run(.profile, on: eventLoop, base.profile(of: sub, on: eventLoop))
    }
    func putLogin(state: String, _ login: LoginState, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.putLogin, on: eventLoop, base.putLogin(state: state, login, ttl: ttl, on: eventLoop))
    }
    func takeLogin(state: String, on eventLoop: any EventLoop) -> EventLoopFuture<LoginState?> {
        run(.takeLogin, on: eventLoop, base.takeLogin(state: state, on: eventLoop))
    }
    func claim(_ claim: Claim, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Bool> {
        run(.claim, on: eventLoop, base.claim(claim, ttl: ttl, on: eventLoop))
    }
    func release(_ claim: Claim, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.release, on: eventLoop, base.release(claim, on: eventLoop))
    }
    func saveRefreshToken(_ sealed: String, clientID: String, grantedAt: Int64, of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.saveRefreshToken, on: eventLoop, base.saveRefreshToken(sealed, clientID: clientID, grantedAt: grantedAt, of: sub, on: eventLoop))
    }
    func refreshTokens(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<[String: String]> {
        run(.refreshTokens, on: eventLoop, base.refreshTokens(of: sub, on: eventLoop))
    }
    func link(_ sub: String, to account: String, on eventLoop: any EventLoop) -> EventLoopFuture<LinkResult> {
        run(.link, on: eventLoop, base.link(sub, to: account, on: eventLoop))
    }
    func unlink(_ sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        run(.unlink, on: eventLoop, base.unlink(sub, on: eventLoop))
    }
    func account(linkedTo sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        run(.account, on: eventLoop, base.account(linkedTo: sub, on: eventLoop))
    }
    func users(on eventLoop: any EventLoop) -> EventLoopFuture<[String]> {
        run(.users, on: eventLoop, base.users(on: eventLoop))
    }
    func putTransfer(_ record: TransferRecord, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.putTransfer, on: eventLoop, base.putTransfer(record, on: eventLoop))
    }
    func transfer(_ id: String, on eventLoop: any EventLoop) -> EventLoopFuture<TransferRecord?> {
        run(.transfer, on: eventLoop, base.transfer(id, on: eventLoop))
    }
    func transfers(on eventLoop: any EventLoop) -> EventLoopFuture<[TransferRecord]> {
        run(.transfers, on: eventLoop, base.transfers(on: eventLoop))
    }
    func putJob(_ job: OutboxJob, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.putJob, on: eventLoop, base.putJob(job, on: eventLoop))
    }
    func jobs(on eventLoop: any EventLoop) -> EventLoopFuture<[OutboxJob]> {
        run(.jobs, on: eventLoop, base.jobs(on: eventLoop))
    }
    func putNonce(_ hash: String, clientID: String, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.putNonce, on: eventLoop, base.putNonce(hash, clientID: clientID, ttl: ttl, on: eventLoop))
    }
    func takeNonce(_ hash: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        run(.takeNonce, on: eventLoop, base.takeNonce(hash, on: eventLoop))
    }
    func job(id: String, on eventLoop: any EventLoop) -> EventLoopFuture<OutboxJob?> {
        run(.job, on: eventLoop, base.job(id: id, on: eventLoop))
    }
    func removeJob(id: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.removeJob, on: eventLoop, base.removeJob(id: id, on: eventLoop))
    }
    func validation(of tokenHash: String, on eventLoop: any EventLoop) -> EventLoopFuture<ValidationRecord?> {
        run(.validation, on: eventLoop, base.validation(of: tokenHash, on: eventLoop))
    }
    func recordValidation(_ record: ValidationRecord, of tokenHash: String, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.recordValidation, on: eventLoop, base.recordValidation(record, of: tokenHash, ttl: ttl, on: eventLoop))
    }
    func markValidated(_ handle: SessionHandle, at: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.markValidated, on: eventLoop, base.markValidated(handle, at: at, on: eventLoop))
    }
    func swapReturnURL(_ url: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        run(.returnURL, on: eventLoop, base.swapReturnURL(url, on: eventLoop))
    }
    func returnURL(on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        run(.returnURL, on: eventLoop, base.returnURL(on: eventLoop))
    }
    func ping(on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        run(.ping, on: eventLoop, base.ping(on: eventLoop))
    }
}
