import ServiceLifecycle

/// Runs `work` every `interval` until the group shuts down.
struct PeriodicTask: Service {
    let interval: Duration
    let work: @Sendable () async -> Void

    init(every interval: Duration, _ work: @escaping @Sendable () async -> Void) {
        self.interval = interval
        self.work = work
    }

    func run() async {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                if Task.isCancelled { return }
                await work()
            }
        }
    }
}
