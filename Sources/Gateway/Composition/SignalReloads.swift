import ServiceLifecycle
import UnixSignals

/// Reloads the configuration on every SIGHUP until the group shuts down. The signal is trapped
/// when this is made (`trapping`), before the gateway says it is listening: a SIGHUP sent right
/// after that line must reload, not end the process (SIGHUP's default action).
struct SignalReloads: Service {
    let hangups: UnixSignalsSequence
    let reload: @Sendable () -> Void

    static func trapping(_ reload: @escaping @Sendable () -> Void) async -> SignalReloads {
        SignalReloads(hangups: await UnixSignalsSequence(trapping: .sighup), reload: reload)
    }

    func run() async {
        for await _ in hangups.cancelOnGracefulShutdown() { reload() }
    }
}
