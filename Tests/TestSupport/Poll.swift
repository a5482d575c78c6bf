import Foundation

/// Waiting for an external process (a redis-server, a sentinel) to reach a state: the condition
/// is checked, then again every interval until it holds or the time is up. There is no event to
/// await from another process, so polling with a deadline is the synchronisation.
public enum Poll {
    public struct Timeout: Error, CustomStringConvertible {
        public let description: String
    }

    /// Blocks (every 50 ms) until `condition` holds; throws `Timeout` once `deadline` passes.
    public static func until(_ deadline: Date, _ what: String, _ condition: () -> Bool) throws {
        while !condition() {
            guard Date() < deadline else { throw Timeout(description: "timed out waiting until \(what)") }
            usleep(50_000)
        }
    }

    /// Suspends (every `interval`) until `condition` holds; throws `Timeout` after `limit`.
    public static func within(_ limit: Duration, every interval: Duration = .milliseconds(50), _ what: String,
                              _ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + limit
        while !condition() {
            guard ContinuousClock.now < deadline else { throw Timeout(description: "timed out after \(limit) waiting until \(what)") }
            try await Task.sleep(for: interval)
        }
    }

    /// The same for a condition that must itself ask (a metrics endpoint).
    public static func within(_ limit: Duration, every interval: Duration = .milliseconds(50), _ what: String,
                              _ condition: () async throws -> Bool) async throws {
        let deadline = ContinuousClock.now + limit
        while try await !condition() {
            guard ContinuousClock.now < deadline else { throw Timeout(description: "timed out after \(limit) waiting until \(what)") }
            try await Task.sleep(for: interval)
        }
    }
}
