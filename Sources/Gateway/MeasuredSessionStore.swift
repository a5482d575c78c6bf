import NIOCore
import Prometheus
import Sessions

/// A session store whose every operation is timed into `sessiongate_store_duration_seconds`
/// (by operation), whichever backend is underneath.
struct MeasuredSessionStore: SessionStore {
    let base: any SessionStore
    private let latency: [String: DurationHistogram]

    init(_ base: any SessionStore, metrics: GatewayMetrics) {
        self.base = base
        latency = Dictionary(uniqueKeysWithValues: GatewayMetrics.storeOperations.map { ($0, metrics.storeLatency($0)) })
    }

    private func timed<T>(_ operation: String, _ future: EventLoopFuture<T>) -> EventLoopFuture<T> {
        let start = NIODeadline.now()
        let histogram = latency[operation]
        future.whenComplete { _ in histogram?.recordNanoseconds(Int64(NIODeadline.now().uptimeNanoseconds - start.uptimeNanoseconds)) }
        return future
    }

    func create(_ session: SessionRecord, profile: UserProfile, expiresAt: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("create", base.create(session, profile: profile, expiresAt: expiresAt, on: eventLoop))
    }
    func load(_ handle: SessionHandle, on eventLoop: any EventLoop) -> EventLoopFuture<StoredSession?> {
        timed("load", base.load(handle, on: eventLoop))
    }
    func touch(_ handle: SessionHandle, lastSeen: Int64, expiresAt: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("touch", base.touch(handle, lastSeen: lastSeen, expiresAt: expiresAt, on: eventLoop))
    }
    func delete(_ handle: SessionHandle, sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("delete", base.delete(handle, sub: sub, on: eventLoop))
    }
    func sessions(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<[SessionRecord]> {
        timed("sessions", base.sessions(of: sub, on: eventLoop))
    }
    func revoke(_ sub: String, at revokedAt: Int64, keep: Int64, forget: Bool, on eventLoop: any EventLoop) -> EventLoopFuture<Int> {
        timed("revoke", base.revoke(sub, at: revokedAt, keep: keep, forget: forget, on: eventLoop))
    }
    func saveProfile(_ profile: UserProfile, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("save_profile", base.saveProfile(profile, on: eventLoop))
    }
    func profile(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<UserProfile?> {
        timed("profile", base.profile(of: sub, on: eventLoop))
    }
    func putLogin(state: String, _ login: LoginState, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("put_login", base.putLogin(state: state, login, ttl: ttl, on: eventLoop))
    }
    func takeLogin(state: String, on eventLoop: any EventLoop) -> EventLoopFuture<LoginState?> {
        timed("take_login", base.takeLogin(state: state, on: eventLoop))
    }
    func claim(_ claim: Claim, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Bool> {
        timed("claim", base.claim(claim, ttl: ttl, on: eventLoop))
    }
    func release(_ claim: Claim, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("release", base.release(claim, on: eventLoop))
    }
    func saveRefreshToken(_ sealed: String, clientID: String, of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("save_refresh_token", base.saveRefreshToken(sealed, clientID: clientID, of: sub, on: eventLoop))
    }
    func refreshTokens(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<[String: String]> {
        timed("refresh_tokens", base.refreshTokens(of: sub, on: eventLoop))
    }
    func link(_ sub: String, to account: String, on eventLoop: any EventLoop) -> EventLoopFuture<LinkResult> {
        timed("link", base.link(sub, to: account, on: eventLoop))
    }
    func unlink(_ sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        timed("unlink", base.unlink(sub, on: eventLoop))
    }
    func account(linkedTo sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        timed("account", base.account(linkedTo: sub, on: eventLoop))
    }
    func users(on eventLoop: any EventLoop) -> EventLoopFuture<[String]> {
        timed("users", base.users(on: eventLoop))
    }
    func putTransfer(_ record: TransferRecord, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("put_transfer", base.putTransfer(record, on: eventLoop))
    }
    func transfer(_ id: String, on eventLoop: any EventLoop) -> EventLoopFuture<TransferRecord?> {
        timed("transfer", base.transfer(id, on: eventLoop))
    }
    func transfers(on eventLoop: any EventLoop) -> EventLoopFuture<[TransferRecord]> {
        timed("transfers", base.transfers(on: eventLoop))
    }
    func putJob(_ job: OutboxJob, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("put_job", base.putJob(job, on: eventLoop))
    }
    func jobs(on eventLoop: any EventLoop) -> EventLoopFuture<[OutboxJob]> {
        timed("jobs", base.jobs(on: eventLoop))
    }
    func putNonce(_ hash: String, clientID: String, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("put_nonce", base.putNonce(hash, clientID: clientID, ttl: ttl, on: eventLoop))
    }
    func takeNonce(_ hash: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        timed("take_nonce", base.takeNonce(hash, on: eventLoop))
    }
    func job(id: String, on eventLoop: any EventLoop) -> EventLoopFuture<OutboxJob?> {
        timed("job", base.job(id: id, on: eventLoop))
    }
    func removeJob(id: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("remove_job", base.removeJob(id: id, on: eventLoop))
    }
    func validation(of tokenHash: String, on eventLoop: any EventLoop) -> EventLoopFuture<ValidationRecord?> {
        timed("validation", base.validation(of: tokenHash, on: eventLoop))
    }
    func recordValidation(_ record: ValidationRecord, of tokenHash: String, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("record_validation", base.recordValidation(record, of: tokenHash, ttl: ttl, on: eventLoop))
    }
    func markValidated(_ handle: SessionHandle, at: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("mark_validated", base.markValidated(handle, at: at, on: eventLoop))
    }
    func ping(on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        timed("ping", base.ping(on: eventLoop))
    }
}
