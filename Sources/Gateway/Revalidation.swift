import AppleID
import Crypto
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Sessions

/// Daily re-validation of Apple refresh tokens (DESIGN §3, apple-sign-in.md §4): at most one
/// call to Apple per token per `revalidate_after`, however many requests and instances ask.
///
/// One validation per token is in flight in the process (single-flight), one in the fleet (the
/// store's `lock:validation:<hash>` claim); the result is stored (`validation:{hash}`) where the
/// other instances adopt it instead of calling Apple. A failed attempt (Apple down, our client
/// misconfigured) is not retried before `retryInterval`.
final class Revalidator: Sendable {
    enum Outcome: Sendable {
        /// Apple confirmed the grant at this time (Unix ms).
        case valid(at: Int64)
        /// Apple says the grant is dead: the user has been revoked.
        case revoked
        /// Apple could not say (transient, throttled, misconfigured): keep within `outage_grace`.
        case unknown
    }

    let apple: AppleServices
    let store: any SessionStore
    let keys: SessionKeys
    /// Milliseconds.
    let after: Int64
    let grace: Int64
    let outageGrace: Int64
    let retryInterval: Int64
    let lockTTL: Int64
    let now: @Sendable () -> Int64
    let logger: Logger
    let metrics: GatewayMetrics
    /// Called for a dead grant (revokes the user everywhere).
    let onRevoked: @Sendable (_ sub: String, _ loop: any EventLoop) -> EventLoopFuture<Int>
    private let inFlight = NIOLockedValueBox<[String: EventLoopFuture<Outcome>]>([:])
    /// At most this many calls to Apple at once per instance: a storm of due sessions queues
    /// here instead of timing out in the HTTP client's pool (and being retried: a second call).
    static let concurrentAppleCalls = 32
    private let limiter = Limiter(limit: Revalidator.concurrentAppleCalls)

    init(apple: AppleServices, store: any SessionStore, keys: SessionKeys, after: Int64, grace: Int64, outageGrace: Int64, appleTimeout: Int64,
         now: @escaping @Sendable () -> Int64, logger: Logger, metrics: GatewayMetrics,
         onRevoked: @escaping @Sendable (String, any EventLoop) -> EventLoopFuture<Int>) {
        self.apple = apple
        self.store = store
        self.keys = keys
        self.after = after
        self.grace = grace
        self.outageGrace = outageGrace
        self.retryInterval = max(1000, min(300_000, after / 10))
        self.lockTTL = appleTimeout + 2000
        self.now = now
        self.logger = logger
        self.metrics = metrics
        self.onRevoked = onRevoked
    }

    /// When a session's validation comes due: `revalidate_after` after the last success, plus
    /// up to 1/24 of it (at most an hour) of per-session jitter, so that a burst of sign-ins does
    /// not become a burst of Apple calls a day later. Never earlier than `revalidate_after`.
    func dueAt(_ session: SessionRecord) -> Int64 {
        let window = min(after / 24, 3_600_000)
        guard window > 0 else { return session.validatedAt + after }
        let seed = session.handle.key.utf8.prefix(8).reduce(UInt64(0)) { $0 &* 31 &+ UInt64($1) }
        return session.validatedAt + after + Int64(seed % UInt64(window))
    }

    enum Need {
        case none
        /// Stale by less than `revalidate_grace`: forward now, validate in the background.
        case background
        /// Stale beyond it: the request waits for the result.
        case blocking
    }

    func need(_ session: SessionRecord, now t: Int64) -> Need {
        guard session.sealedRefreshToken != nil else { return .none }
        let due = dueAt(session)
        if t < due { return .none }
        return t - due < grace ? .background : .blocking
    }

    /// The validation of this session's refresh token: shared with every concurrent caller in the
    /// process, and with the fleet through the store.
    func validate(_ session: SessionRecord, on loop: any EventLoop) -> EventLoopFuture<Outcome> {
        guard let sealed = session.sealedRefreshToken, let token = keys.open(sealed, for: session.handle) else {
            return loop.makeSucceededFuture(.unknown)
        }
        let tokenHash = sha256Hex(token)
        let (future, isNew) = inFlight.withLockedValue { flights -> (EventLoopFuture<Outcome>, Bool) in
            if let running = flights[tokenHash] { return (running, false) }
            let promise = loop.makePromise(of: Outcome.self)
            flights[tokenHash] = promise.futureResult
            promise.completeWithTask {
                let outcome = await self.run(session, token: token, tokenHash: tokenHash, on: loop)
                self.inFlight.withLockedValue { _ = $0.removeValue(forKey: tokenHash) }
                return outcome
            }
            return (promise.futureResult, true)
        }
        return isNew ? future : future.hop(to: loop)
    }

    private func run(_ session: SessionRecord, token: String, tokenHash: String, on loop: any EventLoop) async -> Outcome {
        // Another instance (or an earlier attempt) may have answered already.
        if let adopted = try? await adopt(session, tokenHash: tokenHash, on: loop) { return adopted }
        await limiter.acquire()
        let outcome = await ask(session, token: token, tokenHash: tokenHash, on: loop)
        await limiter.release()
        return outcome
    }

    private func ask(_ session: SessionRecord, token: String, tokenHash: String, on loop: any EventLoop) async -> Outcome {
        do {
            // The wait for a permit may have been long: look again before locking.
            if let adopted = try await adopt(session, tokenHash: tokenHash, on: loop) { return adopted }
            let lock = "lock:validation:" + tokenHash
            guard try await store.claim(lock, ttl: lockTTL, on: loop).get() else {
                // Someone else is asking Apple: wait for their result (bounded by the lock's TTL).
                let deadline = now() + lockTTL
                while now() < deadline {
                    try await Task.sleep(for: .milliseconds(20))
                    if let adopted = try await adopt(session, tokenHash: tokenHash, on: loop) { return adopted }
                }
                return .unknown
            }
            defer { store.release(lock, on: loop).whenFailure { _ in } }
            // The lock holder checks once more: the previous holder may have just finished.
            if let adopted = try await adopt(session, tokenHash: tokenHash, on: loop) { return adopted }
            let outcome = await metrics.timeAppleCall("refresh") { await apple.tokens.refresh(token: token, clientID: session.clientID) }
            let t = now()
            switch outcome {
            case .success:
                metrics.recordAppleCall(endpoint: "refresh", outcome: "ok")
                try await store.recordValidation(ValidationRecord(result: .ok, at: t), of: tokenHash, ttl: after, on: loop).get()
                try await store.markValidated(session.handle, at: t, on: loop).get()
                return .valid(at: t)
            case .grantRevoked(let error):
                metrics.recordAppleCall(endpoint: "refresh", outcome: "grant_revoked")
                logger.info("Apple refused a refresh token: the user is revoked", metadata: ["sub": "\(session.sub)", "error": "\(error)"])
                try await store.recordValidation(ValidationRecord(result: .revoked, at: t), of: tokenHash, ttl: after, on: loop).get()
                _ = try await onRevoked(session.sub, loop).get()
                return .revoked
            case .clientMisconfigured(let error):
                metrics.recordAppleCall(endpoint: "refresh", outcome: "client_misconfigured")
                logger.error("Apple rejected our client during re-validation: sessions are kept within apple.outage_grace; check the apple: configuration (sessiongate check --online)",
                             metadata: ["error": "\(error)"])
                try await store.recordValidation(ValidationRecord(result: .failed, at: t), of: tokenHash, ttl: retryInterval, on: loop).get()
                return .unknown
            case .transient(let reason):
                metrics.recordAppleCall(endpoint: "refresh", outcome: "unavailable")
                logger.warning("Apple unavailable during re-validation: sessions are kept within apple.outage_grace", metadata: ["reason": "\(reason)"])
                try await store.recordValidation(ValidationRecord(result: .failed, at: t), of: tokenHash, ttl: retryInterval, on: loop).get()
                return .unknown
            }
        } catch {
            logger.warning("re-validation could not use the session store", metadata: ["error": "\(error)"])
            return .unknown
        }
    }

    /// A stored result newer than this session's last validation, or a recent failure (not
    /// retried before `retryInterval`).
    private func adopt(_ session: SessionRecord, tokenHash: String, on loop: any EventLoop) async throws -> Outcome? {
        guard let record = try await store.validation(of: tokenHash, on: loop).get() else { return nil }
        switch record.result {
        case .ok where record.at > session.validatedAt:
            try await store.markValidated(session.handle, at: record.at, on: loop).get()
            return .valid(at: record.at)
        case .revoked:
            return .revoked
        case .failed where now() - record.at < retryInterval:
            return .unknown
        default:
            return nil
        }
    }
}

/// A counting semaphore for async code.
actor Limiter {
    private let limit: Int
    private var running = 0
    private var waiters: [CheckedContinuation<Void, Never>] = []

    init(limit: Int) { self.limit = limit }

    func acquire() async {
        if running < limit {
            running += 1
            return
        }
        await withCheckedContinuation { waiters.append($0) }
    }

    func release() {
        if waiters.isEmpty { running -= 1 } else { waiters.removeFirst().resume() }
    }
}
