/// What the store watcher learned of the session store (pinged every second), and what
/// `/readyz` makes of it: 503 until the store has answered once (a replica that never reached
/// its store is misconfigured: keep it out of rotation); 200 after, also while a shared store is
/// down (guarded routes then answer 503 themselves, and public routes keep working — taking
/// every replica out would stop those too).
enum StoreHealth: Equatable, Sendable {
    /// Not pinged yet.
    case unchecked
    case reachable
    /// The last ping failed; `everReached`: an earlier one succeeded.
    case unreachable(everReached: Bool)

    init() { self = .unchecked }

    /// Records a ping's outcome; answers whether reachability changed (the first ping always
    /// does: whatever it finds is logged).
    mutating func record(answered: Bool) -> Bool {
        let before = self
        switch (self, answered) {
        case (_, true): self = .reachable
        case (.reachable, false): self = .unreachable(everReached: true)
        case (.unreachable(let ever), false): self = .unreachable(everReached: ever)
        case (.unchecked, false): self = .unreachable(everReached: false)
        }
        switch (before, self) {
        case (.reachable, .reachable), (.unreachable, .unreachable): return false
        default: return true
        }
    }

    var readiness: AdminEndpoints.Readiness {
        switch self {
        case .unchecked, .unreachable(everReached: false): .storeNeverReached
        case .reachable: .ready
        case .unreachable(everReached: true): .storeDown
        }
    }
}
