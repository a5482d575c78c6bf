import AsyncHTTPClient
import Foundation
import NIOCore
import TestSupport

/// The tests' OpenTelemetry collector (`Tests/tracing/otlp_receiver.py`, opentelemetry-proto's
/// own messages): OTLP/HTTP and OTLP/gRPC receivers, the spans they decoded read back as JSON.
final class OTLPReceiver: Sendable {
    let process: GatewayProcess
    let httpPort: Int
    let grpcPort: Int

    /// A span as the collector decoded it.
    struct Span: Decodable, Sendable {
        let trace_id: String
        let span_id: String
        let parent_span_id: String
        let trace_state: String
        let name: String
        let kind: String
        let start: UInt64
        let end: UInt64
        let attributes: [String: Value]
        let events: [String]
        let status: String
        let resource: [String: Value]
        let via: String
        let headers: [String: String]
        /// gRPC: the exporter's address and port (one per connection).
        let peer: String?

        enum Value: Decodable, Equatable, Sendable {
            case string(String), int(Int64), bool(Bool)

            init(from decoder: any Decoder) throws {
                let c = try decoder.singleValueContainer()
                if let b = try? c.decode(Bool.self) { self = .bool(b) }
                else if let i = try? c.decode(Int64.self) { self = .int(i) }
                else { self = .string(try c.decode(String.self)) }
            }
        }
    }

    static func with<Result>(_ body: (OTLPReceiver) async throws -> Result) async throws -> Result {
        let process = try GatewayProcess(arguments: ["-c", "scripts/otlp-receiver.sh"], executable: "/bin/sh")
        return try await withTeardown(process, stop: { await $0.stopAndWait() }) { process in
            // The first run installs the collector's packages into .build/otlp-venv.
            guard let http = await process.waitForLine(containing: "http ", timeout: 180),
                  let grpc = await process.waitForLine(containing: "grpc ", timeout: 30),
                  let httpPort = Int(http.split(separator: " ").last ?? ""), let grpcPort = Int(grpc.split(separator: " ").last ?? "")
            else { throw Failure("the OTLP receiver did not start") }
            return try await body(OTLPReceiver(process: process, httpPort: httpPort, grpcPort: grpcPort))
        }
    }

    private init(process: GatewayProcess, httpPort: Int, grpcPort: Int) {
        self.process = process
        self.httpPort = httpPort
        self.grpcPort = grpcPort
    }

    var httpEndpoint: String { "http://127.0.0.1:\(httpPort)/v1/traces" }
    var grpcEndpoint: String { "http://127.0.0.1:\(grpcPort)" }

    func spans() async throws -> [Span] {
        let response = try await TestBrowser.http.execute(HTTPClientRequest(url: "http://127.0.0.1:\(httpPort)/spans"), timeout: .seconds(10))
        let body = try await response.body.collect(upTo: 64 << 20)
        return try JSONDecoder().decode([Span].self, from: Data(body.readableBytesView))
    }

    /// The spans of `traceID` once `count` have arrived (the gateway exports each second).
    /// (Fewer, once `limit` passed: the caller's expectations say what is missing.)
    func spans(of traceID: String, count: Int, within limit: Duration = .seconds(15)) async throws -> [Span] {
        var found: [Span] = []
        _ = try? await eventually("\(count) spans of \(traceID)", within: limit) {
            found = try await spans().filter { $0.trace_id == traceID }
            return found.count >= count
        }
        return found
    }

    /// Answers exports with HTTP `status` (gRPC: UNAVAILABLE) until told 0.
    func fail(status: Int) async throws {
        var request = HTTPClientRequest(url: "http://127.0.0.1:\(httpPort)/fail?status=\(status)")
        request.method = .POST
        _ = try await TestBrowser.http.execute(request, timeout: .seconds(10))
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }
}

/// Checks `condition` every 100 ms until it holds (the gateway exports each second); throws
/// once `limit` passed.
func eventually(_ what: String, within limit: Duration = .seconds(15), _ condition: () async throws -> Bool) async throws {
    let deadline = ContinuousClock.now + limit
    while try await !condition() {
        guard ContinuousClock.now < deadline else { throw OTLPReceiver.Failure("timed out waiting until \(what)") }
        try await Task.sleep(for: .milliseconds(100))
    }
}
