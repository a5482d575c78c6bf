import Testing

@testable import Gateway

@Suite("What /readyz makes of the store watcher's pings")
struct StoreHealthTests {
    @Test("each ping outcome, from each state: the next state, the readiness, and whether it is logged", arguments: [
        (StoreHealth.unchecked, true, StoreHealth.reachable, AdminEndpoints.Readiness.ready, true),
        (.unchecked, false, .unreachable(everReached: false), .storeNeverReached, true),
        (.reachable, true, .reachable, .ready, false),
        (.reachable, false, .unreachable(everReached: true), .storeDown, true),
        (.unreachable(everReached: true), false, .unreachable(everReached: true), .storeDown, false),
        (.unreachable(everReached: true), true, .reachable, .ready, true),
        (.unreachable(everReached: false), false, .unreachable(everReached: false), .storeNeverReached, false),
        (.unreachable(everReached: false), true, .reachable, .ready, true),
    ])
    func transitions(from: StoreHealth, answered: Bool, to: StoreHealth, readiness: AdminEndpoints.Readiness, logged: Bool) {
        var health = from
        #expect(health.record(answered: answered) == logged)
        #expect(health == to)
        #expect(health.readiness == readiness)
    }

    @Test("before the first ping the gateway is not ready")
    func uncheckedIsNotReady() {
        #expect(StoreHealth().readiness == .storeNeverReached)
    }
}
