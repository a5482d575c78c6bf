import AsyncHTTPClient
import ServiceLifecycle
import Sessions

/// What the core holds open, as a service: started with the listeners (`start`), kept until
/// the group shuts down, then (last, after the listeners drained) the outbox's queued work, the
/// store's connections and the HTTP client are closed, in that order.
struct CoreResources: Service {
    let outbox: Outbox
    let backend: RedisSessionBackend?
    let http: HTTPClient?
    let held: HeldRevocations

    /// Subscribes to the fleet's channel (what arrives waits for `FleetSubscriber`) and starts
    /// the outbox's passes: before the gateway says it started, so that a caller that then
    /// stops the outbox (a test driving it) is not overtaken.
    func start() {
        backend?.listen()
        outbox.start()
    }

    func run() async {
        try? await gracefulShutdown()
        await close()
    }

    /// Stops the outbox's timer, waits for the jobs being queued, closes the connections.
    func close() async {
        outbox.stop()
        await outbox.drain()
        // One last pass over what is held: the store may answer now (one failure ends it).
        await held.replay(giveUpAfter: 1)
        held.close()
        await backend?.shutdown()
        try? await http?.shutdown()
    }

    /// For a process that will not run (a start-up check failed after the parts were built):
    /// nothing was started or connected.
    func abandon() {
        try? http?.syncShutdown()
    }
}
