/// Runs `body` with `resource`, then awaits `stop(resource)` — also when `body` throws — and
/// only then returns or rethrows. A test's servers, clients and processes end with the test:
/// a `defer { Task { await stop() } }` lets them outlive it and load the tests that follow.
public func withTeardown<Resource, Result>(
    _ resource: Resource, stop: (Resource) async -> Void, _ body: (Resource) async throws -> Result
) async throws -> Result {
    let result: Swift.Result<Result, any Error>
    do { result = .success(try await body(resource)) } catch { result = .failure(error) }
    await stop(resource)
    return try result.get()
}
