import ServiceLifecycle
import UnixSignals

/// Reloads the configuration on every SIGHUP until the group shuts down.
struct SignalReloads: Service {
    let reload: @Sendable () -> Void

    func run() async {
        for await _ in await UnixSignalsSequence(trapping: .sighup).cancelOnGracefulShutdown() { reload() }
    }
}
