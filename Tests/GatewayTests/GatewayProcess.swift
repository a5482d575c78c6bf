import Crypto
import TestSupport
import Foundation
import NIOConcurrencyHelpers

/// The repository root (for the built binary and the shipped configurations).
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path

/// The build products' directory the running tests were built into (`make test`:
/// `.build-test/…/release`; a plain `swift build --build-tests`: `.build/…/debug`).
let buildDirectory = Bundle.main.executableURL!.deletingLastPathComponent()

/// The `sessiongate` executable built beside the tests (`make test` builds both at once).
var sessiongateBinary: String {
    let path = buildDirectory.appendingPathComponent("sessiongate").path
    precondition(FileManager.default.isExecutableFile(atPath: path), "build first: swift build --build-tests (make test does)")
    return path
}

/// A fresh directory with what a gateway with sign-in reads at start: `AuthKey.p8` (a P-256
/// key), `session.key` (64 bytes) and `assertion.pem`. The caller removes it.
func makeSecretsDirectory(_ label: String) throws -> String {
    let directory = NSTemporaryDirectory() + "\(label)-\(UUID().uuidString)"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    try P256.Signing.PrivateKey().pemRepresentation.write(toFile: directory + "/AuthKey.p8", atomically: true, encoding: .utf8)
    try String(repeating: "k", count: 64).write(toFile: directory + "/session.key", atomically: true, encoding: .utf8)
    try P256.Signing.PrivateKey().pemRepresentation.write(toFile: directory + "/assertion.pem", atomically: true, encoding: .utf8)
    return directory
}

/// `sessiongate` run as a real process, its output collected line by line.
final class GatewayProcess: @unchecked Sendable {
    let process = Process()
    private let lines = NIOLockedValueBox<[String]>([])
    /// Output pipes read to their end (2 = all output collected).
    private let closedPipes = NIOLockedValueBox(0)
    private let waiters = NIOLockedValueBox<[(String, CheckedContinuation<String?, Never>, id: Int)]>([])
    private let nextWaiter = NIOLockedValueBox(0)
    let configPath: String

    struct Ports { let proxy: Int; let admin: Int }

    /// Runs `sessiongate` (or `executable`: another server a test runs beside it) with `arguments`.
    init(arguments: [String], configPath: String = "", executable: String? = nil, environment: [String: String]? = nil) throws {
        self.configPath = configPath
        process.executableURL = URL(fileURLWithPath: executable ?? sessiongateBinary)
        process.arguments = arguments
        if let environment { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        process.currentDirectoryURL = URL(fileURLWithPath: repositoryRoot)
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        for pipe in [out, err] {
            let handle = pipe.fileHandleForReading
            Thread {
                var pending = Data()
                while true {
                    let data = handle.availableData
                    if data.isEmpty { break }
                    pending += data
                    while let nl = pending.firstIndex(of: 0x0a) {
                        let line = String(decoding: pending[pending.startIndex..<nl], as: UTF8.self)
                        pending = Data(pending[pending.index(after: nl)...])
                        self.append(line)
                    }
                }
                self.append(nil)
            }.start()
        }
        try process.run()
    }

    /// Starts `serve` with a configuration file written from `yaml`.
    static func serve(yaml: String) throws -> GatewayProcess {
        let path = NSTemporaryDirectory() + "sessiongate-test-\(UUID().uuidString).yaml"
        try yaml.write(toFile: path, atomically: true, encoding: .utf8)
        return try GatewayProcess(arguments: ["serve", "--config", path], configPath: path)
    }

    /// A line of output, or `nil` when one pipe reaches its end.
    private func append(_ line: String?) {
        var ready: [(CheckedContinuation<String?, Never>, String?)] = []
        let allClosed: Bool
        if let line {
            lines.withLockedValue { $0.append(line) }
            allClosed = false
        } else {
            allClosed = closedPipes.withLockedValue { $0 += 1; return $0 == 2 }
        }
        waiters.withLockedValue { list in
            list.removeAll { needle, continuation, _ in
                if let line, line.contains(needle) { ready.append((continuation, line)); return true }
                if allClosed { ready.append((continuation, nil)); return true }
                return false
            }
        }
        for (continuation, value) in ready { continuation.resume(returning: value) }
    }

    var output: [String] { lines.withLockedValue { $0 } }

    /// Suspends until a line containing `needle` is printed (among lines from index `after` on);
    /// nil once all output has been read without it, or after `timeout` seconds.
    func waitForLine(containing needle: String, after start: Int = 0, timeout: Int = 60) async -> String? {
        let id = nextWaiter.withLockedValue { $0 += 1; return $0 }
        let timer = Task {
            try await Task.sleep(for: .seconds(timeout))
            let expired = self.waiters.withLockedValue { list -> CheckedContinuation<String?, Never>? in
                guard let index = list.firstIndex(where: { $0.id == id }) else { return nil }
                return list.remove(at: index).1
            }
            expired?.resume(returning: nil)
        }
        defer { timer.cancel() }
        return await withCheckedContinuation { continuation in
            // Registration and the check are under one lock, so no line can slip between them.
            let immediate: String?? = waiters.withLockedValue { list in
                if let existing = lines.withLockedValue({ $0.dropFirst(start).first { $0.contains(needle) } }) { return .some(existing) }
                if closedPipes.withLockedValue({ $0 == 2 }) { return .some(nil) }
                list.append((needle, continuation, id: id))
                return .none
            }
            if case .some(let value) = immediate { continuation.resume(returning: value) }
        }
    }

    /// Rewrites the configuration file, sends SIGHUP and waits for the reload's verdict line
    /// (`configuration reloaded`, `… reload rejected` or `… reload refused`).
    @discardableResult
    func reload(yaml: String) async throws -> String? {
        let mark = output.count
        try yaml.write(toFile: configPath, atomically: true, encoding: .utf8)
        signal(SIGHUP)
        return await waitForLine(containing: "configuration reload", after: mark)
    }

    /// Suspends until the process has exited and all its output has been read.
    func waitForOutputEnd() async {
        _ = await waitForLine(containing: "\u{0}")
    }

    /// Waits for the "listening" log line and reads the bound ports from it.
    func ports() async throws -> Ports {
        guard let line = await waitForLine(containing: "sessiongate listening") else { throw Failure.exited(output) }
        func port(after key: String) -> Int? {
            // `listen=…` (text) or `"listen":"…"` (json).
            guard let range = line.range(of: "\(key)=") ?? line.range(of: "\"\(key)\":\"") else { return nil }
            let field = line[range.upperBound...].prefix { $0 != " " && $0 != "\"" }
            return field.split(separator: ":").last.flatMap { Int($0) }
        }
        guard let proxy = port(after: "listen"), let admin = port(after: "admin") else { throw Failure.exited([line]) }
        return Ports(proxy: proxy, admin: admin)
    }

    enum Failure: Error { case exited([String]) }

    func signal(_ signal: Int32) { kill(process.processIdentifier, signal) }

    /// Waits for the process to end; its exit status.
    func waitForExit() async -> Int32 {
        await withCheckedContinuation { continuation in
            Thread {
                self.process.waitUntilExit()
                continuation.resume(returning: self.process.terminationStatus)
            }.start()
        }
    }

    /// Peak resident memory (VmHWM) in KiB, from /proc.
    var peakResidentKiB: Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(process.processIdentifier)/status", encoding: .utf8) else { return nil }
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }
        return line.flatMap { Int($0.split(separator: " ").dropFirst().first ?? "") }
    }

    func stop() {
        if process.isRunning { process.terminate() }
        if !configPath.isEmpty { try? FileManager.default.removeItem(atPath: configPath) }
    }

    /// Runs `body` with `serve` started on a configuration written from `yaml`; the process is
    /// ended and has exited before this returns or rethrows.
    static func with<Result>(yaml: String, _ body: (GatewayProcess) async throws -> Result) async throws -> Result {
        try await withTeardown(try serve(yaml: yaml), stop: { await $0.stopAndWait() }, body)
    }

    /// Runs `body` with `sessiongate` (or `executable`) started with `arguments`; the process is
    /// ended and has exited before this returns or rethrows.
    static func with<Result>(arguments: [String], configPath: String = "", executable: String? = nil, environment: [String: String]? = nil,
                             _ body: (GatewayProcess) async throws -> Result) async throws -> Result {
        let process = try GatewayProcess(arguments: arguments, configPath: configPath, executable: executable, environment: environment)
        return try await withTeardown(process, stop: { await $0.stopAndWait() }, body)
    }

    /// SIGTERM (a graceful drain), SIGKILL if it has not exited within `grace`; returns once it
    /// has exited, so that a test's process never outlives the test.
    func stopAndWait(grace: Duration = .seconds(10)) async {
        stop()
        let pid = process.processIdentifier
        let kill9 = Task {
            try await Task.sleep(for: grace)
            kill(pid, SIGKILL)
        }
        _ = await waitForExit()
        kill9.cancel()
    }
}

/// A gateway on Redis with no app behind it (one public route to a closed port), for the tests
/// of the store itself: the secret in `directory` (`makeSecretsDirectory`), the access log off;
/// `store` lines go under `store.redis_url`.
func redisGatewayYAML(directory: String, redisURL: String, store: String = "") -> String {
    """
    server:
      listen: "127.0.0.1:0"
      admin_listen: "127.0.0.1:0"
      access_log: "off"
    session:
      secret_file: "\(directory)/session.key"
    store:
      redis_url: "\(redisURL)"
    \(store)
    routes:
      - name: app
        upstream: "http://127.0.0.1:1"
        auth: public

    """
}

func gatewayYAML(upstreamPort: Int, extraServer: String = "", routes: String? = nil) -> String {
    """
    server:
      listen: "127.0.0.1:0"
      admin_listen: "127.0.0.1:0"
    \(extraServer)
    routes:
    \(routes ?? "  - name: app\n    upstream: \"http://127.0.0.1:\(upstreamPort)\"\n    auth: public")
    """
}
