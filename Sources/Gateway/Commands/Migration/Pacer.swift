/// A minimum spacing between calls (`--rate` per second). It measures intervals on the
/// monotonic clock, not the wall clock: a spacing is not a point in session time.
actor Pacer {
    private let interval: Duration
    private var next = ContinuousClock.now

    init(perSecond: Double) { interval = .nanoseconds(Int64(1_000_000_000 / max(perSecond, 0.001))) }

    func wait() async throws {
        let now = ContinuousClock.now
        let slot = max(next, now)
        next = slot + interval
        if slot > now { try await Task.sleep(until: slot, clock: .continuous) }
    }
}
