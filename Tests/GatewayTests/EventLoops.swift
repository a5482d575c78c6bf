import NIOPosix
import TestSupport

/// Runs `body` on event loops of its own (`threads` of them), shut down before this returns or
/// rethrows: for a test whose load must not reach the process's shared loops, or whose
/// connections must share one loop.
func withEventLoops<Result>(_ threads: Int, _ body: (MultiThreadedEventLoopGroup) async throws -> Result) async throws -> Result {
    try await withTeardown(MultiThreadedEventLoopGroup(numberOfThreads: threads), stop: { try? await $0.shutdownGracefully() }, body)
}
