import Foundation

/// Runs blocking work (sockets, processes, a long CPU loop) on a thread of its own: the
/// cooperative pool has one thread per core (two here), and a test that holds one stalls every
/// other test of the run.
public func blocking<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread { continuation.resume(with: Result { try work() }) }
        thread.start()
    }
}
