import AppleID
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Sessions

/// Runs the store's outbox (`OutboxJob`): work that must be done at least once whatever
/// instance dies — a refresh token to revoke at Apple, an event to deliver to the app. Every
/// instance looks for due jobs every few seconds; one claims each attempt (`Claim.job`); a
/// failure is retried after a backoff (5 s doubling to an hour), until it succeeds.
final class Outbox: Sendable {
    /// What one kind of job does: `.done`, or `.retry` later, or `.drop` (it can never succeed).
    enum Result: Sendable { case done, retry, drop }
    typealias Runner = @Sendable (OutboxJob, any EventLoop) async -> Result

    let store: any SessionStore
    let loop: any EventLoop
    let now: @Sendable () -> Int64
    let metrics: GatewayMetrics
    let logger: Logger
    /// How long one attempt may hold its claim (the slowest call it makes, and margin).
    let attemptTTL: Int64
    private let runners: NIOLockedValueBox<[OutboxJob.Kind: Runner]> = NIOLockedValueBox([:])
    private let timer = NIOLockedValueBox<RepeatedTask?>(nil)
    /// Jobs being queued (an event emitted while a request was answered): shutdown waits for
    /// them before the store closes, so none is lost.
    private let queuing = NIOLockedValueBox<(next: Int, pending: [Int: EventLoopFuture<Void>])>((0, [:]))
    static let interval: TimeAmount = .seconds(5)

    init(store: any SessionStore, loop: any EventLoop, now: @escaping @Sendable () -> Int64, attemptTTL: Int64, metrics: GatewayMetrics, logger: Logger) {
        self.store = store
        self.loop = loop
        self.now = now
        self.attemptTTL = attemptTTL
        self.metrics = metrics
        self.logger = logger
    }

    func register(_ kind: OutboxJob.Kind, _ runner: @escaping Runner) {
        runners.withLockedValue { $0[kind] = runner }
    }

    /// The delay before attempt `attempts + 1` (ms): 5 s doubling, at most an hour.
    static func backoff(attempts: Int) -> Int64 {
        min(3_600_000, 5000 << Int64(min(max(attempts - 1, 0), 20)))
    }

    /// Queues `job` (its first attempt at once, or at its `nextAttempt`).
    func enqueue(_ job: OutboxJob) async throws {
        try await store.putJob(job, on: loop).get()
    }

    func start() {
        let task = loop.scheduleRepeatedAsyncTask(initialDelay: Self.interval, delay: Self.interval) { _ in
            self.loop.makeFutureWithTask { await self.runDue() }
        }
        timer.withLockedValue { $0 = task }
    }

    func stop() {
        timer.withLockedValue { $0?.cancel(); $0 = nil }
    }

    /// Queues `job` in the background and tries it once queued; shutdown waits for both (an
    /// event emitted by a one-shot command is attempted before the command exits).
    func enqueueInBackground(_ job: OutboxJob, onFailure: @escaping @Sendable (any Error) -> Void) {
        let queued = loop.makeFutureWithTask { try await self.enqueue(job) }
        let attempted = queued.flatMap { self.loop.makeFutureWithTask { _ = await self.runDue(only: [job.id]) } }
            .recover { error in onFailure(error) }
        let id = queuing.withLockedValue { q -> Int in
            q.next += 1
            q.pending[q.next] = attempted
            return q.next
        }
        attempted.whenComplete { _ in _ = self.queuing.withLockedValue { $0.pending.removeValue(forKey: id) } }
    }

    /// Waits until every job being queued is in the store (or failed) and had its first attempt.
    func drain() async {
        for future in queuing.withLockedValue({ Array($0.pending.values) }) { _ = try? await future.get() }
    }

    /// One pass: every due job (or only `ids`), each attempted by the one instance that claims it.
    /// Answers the ids done.
    @discardableResult
    func runDue(only ids: Set<String>? = nil) async -> Set<String> {
        guard let jobs = try? await store.jobs(on: loop).get() else { return [] }
        let t = now()
        recordPending(jobs, now: t)
        var done: Set<String> = []
        for job in jobs where ids?.contains(job.id) ?? (job.nextAttempt <= t) {
            if await attempt(job) { done.insert(job.id) }
        }
        return done
    }

    private func attempt(_ job: OutboxJob) async -> Bool {
        guard let runner = runners.withLockedValue({ $0[job.kind] }) else { return false }
        guard (try? await store.claim(.job(id: job.id), ttl: attemptTTL, on: loop).get()) == true else { return false }
        defer { store.release(.job(id: job.id), on: loop).whenFailure { _ in } }
        // Another instance may have finished it between our read and our claim.
        guard let current = try? await store.job(id: job.id, on: loop).get(), current.attempts == job.attempts else { return false }
        switch await runner(job, loop) {
        case .done:
            metrics.recordOutboxAttempt(kind: job.kind, result: .done)
            try? await store.removeJob(id: job.id, on: loop).get()
            return true
        case .drop:
            metrics.recordOutboxAttempt(kind: job.kind, result: .dropped)
            try? await store.removeJob(id: job.id, on: loop).get()
            return false
        case .retry:
            metrics.recordOutboxAttempt(kind: job.kind, result: .failed)
            var next = job
            next.attempts += 1
            next.nextAttempt = now() + Self.backoff(attempts: next.attempts)
            try? await store.putJob(next, on: loop).get()
            return false
        }
    }

    private func recordPending(_ jobs: [OutboxJob], now t: Int64) {
        for kind in OutboxJob.Kind.allCases {
            let mine = jobs.filter { $0.kind == kind }
            metrics.recordOutbox(kind: kind, pending: mine.count, oldestSeconds: mine.map { max(0, t - $0.created) / 1000 }.max() ?? 0)
        }
    }
}
