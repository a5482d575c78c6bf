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
/// other instances adopt it instead of calling Apple. When the call may be made is
/// `RetryPolicy`'s decision: a failed attempt (Apple down or throttling) is retried after an
/// exponential backoff with jitter or Apple's `Retry-After`; when Apple refuses our client
/// (`invalid_client`) or throttles it (429), the client's circuit opens for the whole fleet and
/// one probe at a time finds out whether it is mended.
final class Revalidator: Sendable {
    enum Outcome: Sendable {
        /// Apple confirmed the grant at this time (Unix ms).
        case valid(at: Int64)
        /// Apple says the grant is dead: the user has been revoked.
        case revoked
        /// Apple could not say (transient, throttled, misconfigured, backing off): keep within
        /// `outage_grace`.
        case unknown
    }

    let apple: AppleServices
    let store: any SessionStore
    let keys: SessionKeys
    let times: RevalidationTimes
    let retry: RetryPolicy
    let lockTTL: Int64
    let now: @Sendable () -> Int64
    let logger: Logger
    let metrics: GatewayMetrics
    /// Tells the instances waiting on a token's lock that its result is stored.
    let fleet: FleetPublisher
    /// A dead grant revokes the user everywhere.
    let revocations: Revocations
    private let inFlight = NIOLockedValueBox<[String: EventLoopFuture<Outcome>]>([:])
    /// The clients whose refresh requests Apple has answered with a success or `invalid_grant`
    /// since this process started (`AppleTokenOutcome.judged`): only for those is
    /// `invalid_request` the user's revocation rather than our own malformed request.
    private let provenClients = NIOLockedValueBox<Set<String>>([])
    /// Validations waiting for another instance's result, by token hash.
    private let waiters = NIOLockedValueBox<[String: [EventLoopPromise<Void>]]>([:])
    /// At most this many calls to Apple at once per instance: a storm of due sessions queues
    /// here instead of timing out in the HTTP client's pool (and being retried: a second call).
    static let concurrentAppleCalls = 32
    private let limiter = Limiter(limit: Revalidator.concurrentAppleCalls)

    init(apple: AppleServices, store: any SessionStore, keys: SessionKeys, times: RevalidationTimes, appleTimeout: Int64,
         now: @escaping @Sendable () -> Int64, logger: Logger, metrics: GatewayMetrics, fleet: FleetPublisher, revocations: Revocations) {
        self.apple = apple
        self.store = store
        self.keys = keys
        self.times = times
        self.retry = RetryPolicy(times)
        self.lockTTL = appleTimeout + 2000
        self.now = now
        self.logger = logger
        self.metrics = metrics
        self.fleet = fleet
        self.revocations = revocations
    }

    /// Another instance stored a result for this token (`FleetMessage.validated`): the
    /// validations waiting on its lock read it now.
    func resultStored(_ tokenHash: String) {
        for waiter in waiters.withLockedValue({ $0.removeValue(forKey: tokenHash) ?? [] }) { waiter.succeed() }
    }

    /// A waiter for `tokenHash`'s next stored result, registered before the lock is tried: a
    /// holder that stores and publishes between our failed claim and our wait cannot be missed.
    private func register(_ tokenHash: String, on loop: any EventLoop) -> EventLoopPromise<Void> {
        let promise = loop.makePromise(of: Void.self)
        waiters.withLockedValue { $0[tokenHash, default: []].append(promise) }
        return promise
    }

    /// Takes a waiter back out (the lock was ours after all); completes it if still there.
    private func unregister(_ promise: EventLoopPromise<Void>, _ tokenHash: String) {
        let mine = waiters.withLockedValue { list -> Bool in
            guard let i = list[tokenHash]?.firstIndex(where: { $0.futureResult === promise.futureResult }) else { return false }
            list[tokenHash]?.remove(at: i)
            if list[tokenHash]?.isEmpty == true { list[tokenHash] = nil }
            return true
        }
        if mine { promise.succeed() }
    }

    /// Waits until `resultStored(tokenHash)` or `timeout` (the lock's TTL: a holder that died
    /// leaves no message), whichever is first. Whoever takes the promise out of `waiters`
    /// completes it, once.
    private func awaitResult(_ promise: EventLoopPromise<Void>, _ tokenHash: String, timeout: Int64, on loop: any EventLoop) async {
        let timer = loop.scheduleTask(in: .milliseconds(timeout)) {
            let mine = self.waiters.withLockedValue { list -> Bool in
                guard let i = list[tokenHash]?.firstIndex(where: { $0.futureResult === promise.futureResult }) else { return false }
                list[tokenHash]?.remove(at: i)
                if list[tokenHash]?.isEmpty == true { list[tokenHash] = nil }
                return true
            }
            if mine { promise.succeed() }
        }
        try? await promise.futureResult.get()
        timer.cancel()
    }

    /// The validation of this session's refresh token: shared with every concurrent caller in the
    /// process, and with the fleet through the store.
    /// - Parameters:
    ///   - keep: how long a revocation is kept (the running absolute session timeout, ms).
    ///   - scope: the trace of the request that found it due (a `revalidation` span under it).
    func validate(_ session: SessionRecord, keep: Int64, scope: TraceScope? = nil, on loop: any EventLoop) -> EventLoopFuture<Outcome> {
        // Not due (yet): the session read fresh from the store (`validateFromStore`) by a request
        // that found its cached copy stale while another's validation was being written. Asked
        // again, it was a second call to Apple for one token (`RetryPolicy.step` takes an `ok`
        // record no newer than the session's own validation for a due session's last one).
        if now() < times.dueAt(session) { return loop.makeSucceededFuture(.valid(at: session.validatedAt)) }
        if session.sealedRefreshToken == SessionRecord.tokenInStore { return validateFromStore(session.handle, keep: keep, scope: scope, on: loop) }
        guard let sealed = session.sealedRefreshToken, let token = keys.open(sealed, for: session.handle) else {
            return loop.makeSucceededFuture(.unknown)
        }
        let tokenHash = sha256Hex(token)
        let (future, isNew) = inFlight.withLockedValue { flights -> (EventLoopFuture<Outcome>, Bool) in
            if let running = flights[tokenHash] { return (running, false) }
            let promise = loop.makePromise(of: Outcome.self)
            flights[tokenHash] = promise.futureResult
            promise.completeWithTask {
                let outcome = await TraceScope.with(scope) {
                    await TraceScope.span("revalidation") { await self.run(session, token: token, tokenHash: tokenHash, keep: keep, on: loop) }
                }
                self.inFlight.withLockedValue { _ = $0.removeValue(forKey: tokenHash) }
                return outcome
            }
            return (promise.futureResult, true)
        }
        return isNew ? future : future.hop(to: loop)
    }

    /// `validate` for a session held without its token (the local cache): the session is read
    /// from the store first, once for all the requests that ask meanwhile. A session the store
    /// no longer has is over (`revoked`).
    private func validateFromStore(_ handle: SessionHandle, keep: Int64, scope: TraceScope?, on loop: any EventLoop) -> EventLoopFuture<Outcome> {
        let flight = "session:" + handle.key  // token hashes are hex: no clash
        let promise = loop.makePromise(of: Outcome.self)
        let running = inFlight.withLockedValue { flights -> EventLoopFuture<Outcome>? in
            if let running = flights[flight] { return running }
            flights[flight] = promise.futureResult
            return nil
        }
        if let running {
            promise.succeed(.unknown)  // not used: a promise must not be dropped unfulfilled
            return running.hop(to: loop)
        }
        // Started outside the lock: a future that fails at once runs its callbacks here.
        let loaded = store.load(handle, on: loop)
        OpenSpan.store(.load, tracer: scope?.tracer, parent: scope?.context)?.end(with: loaded)
        loaded.flatMap { stored -> EventLoopFuture<Outcome> in
            guard let stored else { return loop.makeSucceededFuture(.revoked) }
            guard stored.session.sealedRefreshToken != SessionRecord.tokenInStore else { return loop.makeSucceededFuture(.unknown) }
            return self.validate(stored.session, keep: keep, scope: scope, on: loop)
        }.recover { error in
            self.logger.warning("re-validation could not use the session store", metadata: ["error": "\(error)"])
            return .unknown
        }.whenComplete { result in
            self.inFlight.withLockedValue { _ = $0.removeValue(forKey: flight) }
            promise.completeWith(result)
        }
        return promise.futureResult
    }

    private func run(_ session: SessionRecord, token: String, tokenHash: String, keep: Int64, on loop: any EventLoop) async -> Outcome {
        do {
            // Another instance (or an earlier attempt) may have answered already, or a failure
            // is being backed off.
            if case .settled(let outcome) = try await plan(session, tokenHash: tokenHash, keep: keep, on: loop) { return outcome }
            await limiter.acquire()
            let outcome = await ask(session, token: token, tokenHash: tokenHash, keep: keep, on: loop)
            await limiter.release()
            return outcome
        } catch {
            logger.warning("re-validation could not use the session store", metadata: ["error": "\(error)"])
            return .unknown
        }
    }

    private enum Plan {
        case settled(Outcome)
        /// Call Apple; the token's last record (its failures count).
        case ask(ValidationRecord?)
    }

    /// What the fleet's record of this token says to do (`RetryPolicy.step`).
    private func plan(_ session: SessionRecord, tokenHash: String, keep: Int64, on loop: any EventLoop) async throws -> Plan {
        let record = try await store.validation(of: tokenHash, on: loop).get()
        switch retry.step(record, validatedAt: session.validatedAt, now: now()) {
        case .adopt(let at):
            try await store.markValidated(session.handle, at: at, on: loop).get()
            return .settled(.valid(at: at))
        case .revoked:
            // Apple refused this token earlier; whoever saw it revoked the grant, unless that
            // failed (the store did not answer): revoking again is idempotent.
            if let sessions = try? await store.sessions(of: session.sub, on: loop).get(), sessions.contains(where: { $0.created <= session.created }) {
                _ = try? await revocations.revokeUser(session.sub, source: .appleInvalidGrant, at: session.created, keep: keep, forget: .grants, on: loop).get()
            }
            return .settled(.revoked)
        case .wait:
            metrics.recordAppleCallDeferred(.backoff)
            return .settled(.unknown)
        case .givenUp:
            metrics.recordAppleCallDeferred(.outage)
            return .settled(.unknown)
        case .ask:
            return .ask(record)
        }
    }

    private func ask(_ session: SessionRecord, token: String, tokenHash: String, keep: Int64, on loop: any EventLoop) async -> Outcome {
        do {
            // The wait for a permit may have been long: look again before locking.
            if case .settled(let outcome) = try await plan(session, tokenHash: tokenHash, keep: keep, on: loop) { return outcome }
            let lock = Claim.validation(tokenHash: tokenHash)
            let waiter = register(tokenHash, on: loop)
            let claimed: Bool
            do { claimed = try await store.claim(lock, ttl: lockTTL, on: loop).get() } catch {
                unregister(waiter, tokenHash)
                throw error
            }
            guard claimed else {
                // Another instance is asking Apple: its message (`validated`) wakes us when it
                // is done; the lock's TTL bounds the wait if it never comes.
                await awaitResult(waiter, tokenHash, timeout: lockTTL, on: loop)
                if case .settled(let outcome) = try await plan(session, tokenHash: tokenHash, keep: keep, on: loop) { return outcome }
                return .unknown
            }
            unregister(waiter, tokenHash)
            // However this ends (a result, the circuit holding, a store error), the instances
            // waiting on the lock are told once it is released.
            defer {
                store.release(lock, on: loop).whenFailure { _ in }
                fleet.publish(.validated(tokenHash: tokenHash), on: loop)
            }
            // The lock holder checks once more: the previous holder may have just finished.
            let previous: ValidationRecord?
            switch try await plan(session, tokenHash: tokenHash, keep: keep, on: loop) {
            case .settled(let outcome): return outcome
            case .ask(let record): previous = record
            }
            // Apple refused or throttled our client lately: the whole fleet holds back, but for
            // one probe.
            let circuitName = Self.circuitName(session.clientID)
            let probe = Claim.probe(clientID: session.clientID)
            var isProbe = false
            // Released once the probe's answer is recorded (the circuit's next retry time then
            // holds the fleet back).
            defer { if isProbe { store.release(probe, on: loop).whenFailure { _ in } } }
            var circuit = try await store.validation(of: circuitName, on: loop).get()
            switch retry.circuit(circuit, validatedAt: session.validatedAt, now: now()) {
            case .closed: break
            case .holds:
                metrics.recordAppleCallDeferred(.circuit)
                return .unknown
            case .givenUp:
                metrics.recordAppleCallDeferred(.outage)
                return .unknown
            case .probe:
                guard try await store.claim(probe, ttl: lockTTL, on: loop).get() else {
                    metrics.recordAppleCallDeferred(.circuit)
                    return .unknown
                }
                isProbe = true
                // The circuit as it is now: a probe that ended between the read above and the
                // claim has released it with the circuit opened again (its answer recorded).
                circuit = try await store.validation(of: circuitName, on: loop).get()
                let current = retry.circuit(circuit, validatedAt: session.validatedAt, now: now())
                guard current == .probe || current == .closed else {
                    metrics.recordAppleCallDeferred(.circuit)
                    return .unknown
                }
            }
            let answered = await metrics.timeAppleCall(.refresh) { await apple.tokens.refresh(token: token, clientID: session.clientID) }
            let outcome = provenClients.withLockedValue { proven in
                if answered.provesRequests { proven.insert(session.clientID) }
                return answered.judged(clientProven: proven.contains(session.clientID))
            }
            let t = now()
            metrics.recordAppleCall(endpoint: .refresh, outcome: outcome.metricLabel)
            if circuit?.result == .failed, outcome.provesClient {
                logger.notice("Apple answers our client again: re-validation resumes", metadata: ["client_id": "\(session.clientID)"])
                try await store.recordValidation(ValidationRecord(result: .ok, at: t), of: circuitName, ttl: 0, on: loop).get()
            }
            switch outcome {
            case .success:
                try await store.recordValidation(ValidationRecord(result: .ok, at: t), of: tokenHash, ttl: times.after, on: loop).get()
                try await store.markValidated(session.handle, at: t, on: loop).get()
                return .valid(at: t)
            case .grantRevoked(let error):
                // The grant this session came from is dead: it and the sessions before it end, with
                // the tokens granted up to it. A session from a newer consent (the user came back
                // after a notification we missed) lives on, and is validated on its own schedule.
                logger.info("Apple refused a refresh token: the sessions of its grant and older end", metadata: ["sub": "\(session.sub)", "error": "\(error)"])
                // Revoked, or held until the store takes it (refused here meanwhile): Apple's
                // answer is never lost to a store outage. The fleet's record after it.
                try await revocations.durably(.user(sub: session.sub, source: .appleInvalidGrant, at: session.created, happened: t, forget: .grants,
                                                        event: nil, reason: nil, atApple: false), keep: keep, on: loop)
                try? await store.recordValidation(ValidationRecord(result: .revoked, at: t), of: tokenHash, ttl: times.after, on: loop).get()
                return .revoked
            case .clientMisconfigured(let error):
                let opened = retry.failed(after: circuit, at: t, retryAfter: nil, jitter: .random(in: 0..<1))
                logger.error("Apple rejected our client during re-validation: the fleet holds re-validations back for this client and probes again later; sessions are kept within apple.outage_grace; check the apple: configuration (sessiongate check --online)",
                             metadata: ["error": "\(error)", "client_id": "\(session.clientID)", "probe_in_s": .stringConvertible((opened.retryAt - t) / 1000)])
                try await store.recordValidation(opened, of: circuitName, ttl: retry.keep(opened, now: t), on: loop).get()
                return .unknown
            case .transient(let reason, let retryAfter):
                let failed = retry.failed(after: previous, at: t, retryAfter: retryAfter, jitter: .random(in: 0..<1))
                logger.warning("Apple unavailable during re-validation: sessions are kept within apple.outage_grace",
                               metadata: ["reason": "\(reason)", "failures": .stringConvertible(failed.failures), "retry_in_s": .stringConvertible((failed.retryAt - t) / 1000)])
                try await store.recordValidation(failed, of: tokenHash, ttl: retry.keep(failed, now: t), on: loop).get()
                return .unknown
            case .throttled(let retryAfter):
                // Every call of the client would be throttled alike: the circuit backs the whole
                // fleet off (one probe per retry), and this token its own way besides, so that
                // the fleet's tokens do not all come back at once.
                let opened = retry.failed(after: circuit, at: t, retryAfter: retryAfter, jitter: .random(in: 0..<1), .throttled)
                let failed = retry.failed(after: previous, at: t, retryAfter: retryAfter, jitter: .random(in: 0..<1), .throttled)
                logger.warning("Apple throttles re-validation (429): the fleet holds re-validations back for this client and probes again later; sessions are kept within apple.outage_grace",
                               metadata: ["client_id": "\(session.clientID)", "failures": .stringConvertible(opened.failures), "probe_in_s": .stringConvertible((opened.retryAt - t) / 1000)])
                try await store.recordValidation(opened, of: circuitName, ttl: retry.keep(opened, now: t), on: loop).get()
                try await store.recordValidation(failed, of: tokenHash, ttl: retry.keep(failed, now: t), on: loop).get()
                return .unknown
            }
        } catch {
            logger.warning("re-validation could not use the session store", metadata: ["error": "\(error)"])
            return .unknown
        }
    }

    /// The store name of a client's circuit (a `ValidationRecord` beside the tokens' ones; token
    /// hashes are hex, so the names never meet).
    static func circuitName(_ clientID: String) -> String { "client:" + clientID }
}

extension AppleTokenOutcome {
    /// The `outcome` label of `sessiongate_apple_calls_total`.
    var metricLabel: GatewayMetrics.AppleCallOutcome {
        switch self {
        case .success: .ok
        case .grantRevoked: .grantRevoked
        case .clientMisconfigured: .clientMisconfigured
        case .transient: .unavailable
        case .throttled: .throttled
        }
    }

    /// Apple authenticated our client (whatever it said of the grant).
    var provesClient: Bool {
        switch self {
        case .success, .grantRevoked: true
        case .clientMisconfigured, .transient, .throttled: false
        }
    }
}
