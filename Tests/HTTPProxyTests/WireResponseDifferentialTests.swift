import Foundation
import NIOCore
import NIOEmbedded
import NIOHTTP1
import TestSupport
import Testing

@testable import HTTPProxy

/// The response side of the differential fuzzing (`WireDifferentialTests`): generated and
/// mutated upstream responses (one or two, each answering a GET or a HEAD) to our
/// `ResponseReader` (what the upstream connections run: `HeadParser(kind: .response)`,
/// `MessageFraming.response` and `BodyDecoder`), and to NIO's
/// `HTTPResponseDecoder`, the connection closed after the last byte. Compared: accept/reject,
/// status, version, fields, body bytes, trailers. 1xx other than 101 are skipped by both.
@Suite("Wire engine: differential fuzzing of responses against NIO's llhttp decoder")
struct WireResponseDifferentialTests {
    typealias Message = WireDifferentialTests.Message
    typealias Outcome = WireDifferentialTests.Outcome

    static func reference(_ input: [UInt8], methods: [HTTPMethod]) -> Outcome {
        let channel = EmbeddedChannel()
        var outcome = Outcome()
        do {
            try channel.pipeline.syncOperations.addHandler(HTTPRequestEncoder())
            try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .forwardBytes)))
            for method in methods {
                try channel.writeOutbound(HTTPClientRequestPart.head(HTTPRequestHead(version: .http1_1, method: method, uri: "/")))
                try channel.writeOutbound(HTTPClientRequestPart.end(nil))
            }
            try channel.writeInbound(channel.allocator.buffer(bytes: input))
        } catch {
            outcome.rejected = true
        }
        var parts: [HTTPClientResponsePart] = []
        while let part = try? channel.readInbound(as: HTTPClientResponsePart.self) { parts.append(part) }
        if !outcome.rejected {
            // EOF: ends a body read until close, and is an error inside any other.
            channel.close(promise: nil)
            channel.embeddedEventLoop.run()
            do { try channel.throwIfErrorCaught() } catch { outcome.rejected = true }
            while let part = try? channel.readInbound(as: HTTPClientResponsePart.self) { parts.append(part) }
        }
        _ = try? channel.finish(acceptAlreadyClosed: true)
        WireDifferentialTests.collect(parts, into: &outcome) { head in
            Message(method: "\(head.status.code)", target: "", version: "\(head.version)", headers: WireDifferentialTests.lines(head.headers),
                    body: [], trailers: nil)
        }
        return outcome
    }

    static func ours(_ input: [UInt8], methods: [HTTPMethod]) -> Outcome {
        var outcome = Outcome()
        var reader = ResponseReader()
        for method in methods { reader.expectResponse(to: method) }
        reader.receive(ByteBuffer(bytes: input))
        var current: Message? = nil
        do {
            // All input is here: when the reader needs more, the connection has closed (EOF).
            while let part = try reader.next() ?? reader.finish() {
                switch part {
                case .head(let head):
                    let message = Message(method: "\(head.status)", target: "", version: "\(head.version)",
                                          headers: head.fields.map { "\(head.name($0)): \(head.value($0))" }, body: [], trailers: nil)
                    if (100..<200).contains(head.status), head.status != 101 {
                        // Skipped, as NIO does. llhttp takes `Connection: close` on an interim
                        // response as the end of the connection and refuses what follows: not
                        // compared past it.
                        if !WireDifferentialTests.keepsAlive(message) {
                            outcome.reason = Self.closingInterim
                            return outcome
                        }
                        continue
                    }
                    if head.status == 101 {
                        outcome.messages.append(message)
                        return outcome
                    }
                    current = message
                case .body(let bytes):
                    current?.body += bytes.readableBytesView
                case .end(let trailers):
                    if stops(WireDifferentialTests.complete(&current, trailers, into: &outcome)) { return outcome }
                }
            }
        } catch {
            outcome.rejected = true
            outcome.reason = "\(error)"
        }
        return outcome
    }

    static let closingInterim = "an interim response closing the connection"

    /// Nothing is compared after a response that closes the connection or switches protocols.
    static func stops(_ message: Message) -> Bool { message.method == "101" || !WireDifferentialTests.keepsAlive(message) }

    static func comparable(_ outcome: Outcome) -> Outcome {
        guard let last = outcome.messages.firstIndex(where: stops) else { return outcome }
        return Outcome(messages: Array(outcome.messages.prefix(last + 1)), rejected: false, reason: outcome.reason)
    }

    /// Where ours refuses a response llhttp reads (the proxy answers 502 instead of relaying a
    /// response whose framing another hop could read differently).
    static let stricterOnPurpose: [(name: String, applies: @Sendable (Message?, String) -> Bool)] = [
        ("Transfer-Encoding other than one exactly chunked, or beside Content-Length (ExchangeRules.responseHead)", { m, reason in
            reason == "ambiguous response framing"
        }),
        ("duplicate or non-digit Content-Length", { m, reason in reason == "duplicate Content-Length" || reason == "invalid Content-Length" }),
        ("a lone LF or CR, or line ends between responses", { _, reason in
            reason == "line not ended by CRLF" || reason == "bare CR" || reason == "line ends after a response" || reason == "empty line before the status line"
        }),
        // llhttp takes `HTTP/1.1 099 x`, `HTTP/1.1 200 O\u{1}K` and `HTTP/1.1  200 OK`; the
        // proxy refused a status below 100 already (ExchangeRules.responseHead) and writes its
        // own reason phrase, so a control character there gains nothing.
        ("status line: a status below 100, a control character in the reason, or more than one SP", { _, reason in reason == "invalid status line" }),
    ]

    typealias Report = WireDifferentialTests.Report

    static func run(seed: UInt64, cases: Int) -> Report {
        var random = SplitMix64(seed: seed)
        var report = Report()
        for index in 0..<cases {
            var bytes: [UInt8] = []
            var methods: [HTTPMethod] = []
            for _ in 0..<(RequestGenerator.chance(20, &random) ? 2 : 1) {
                let head = RequestGenerator.chance(10, &random)
                methods.append(head ? .HEAD : .GET)
                bytes += ResponseGenerator.response(&random, head: head)
            }
            if RequestGenerator.chance(33, &random) { RequestGenerator.mutate(&bytes, &random) }
            let expected = comparable(reference(bytes, methods: methods))
            let got = comparable(ours(bytes, methods: methods))
            let more = report.tally(expected, got, explained: {
                guard expected.messages.starts(with: got.messages) else { return nil }
                if got.reason == Self.closingInterim { return "not compared past \(Self.closingInterim)" }
                guard got.rejected else { return nil }
                let refused = expected.messages.dropFirst(got.messages.count).first ?? expected.pending
                return stricterOnPurpose.first { $0.applies(refused, got.reason ?? "") }?.name
            }, case: { "case \(index) (WIRE_FUZZ_SEED=\(seed)) \(methods): \(String(decoding: bytes, as: UTF8.self).debugDescription)" })
            if !more { break }
        }
        return report
    }

    @Test("generated and mutated responses parse the same, or ours is stricter for a listed reason")
    func differential() async throws {
        try await WireDifferentialTests.fuzz("responses", defaultCases: 25_000, Self.run)
    }
}

/// Upstream responses from a grammar with the framing edge cases.
enum ResponseGenerator {
    static let statusLines = ["HTTP/1.1 200 OK", "HTTP/1.1 404 Not Found", "HTTP/1.0 200 OK", "HTTP/1.1 204 No Content", "HTTP/1.1 304 Not Modified",
                              "HTTP/1.1 100 Continue", "HTTP/1.1 200", "HTTP/1.1 200 ", "HTTP/1.1 500 Internal\tError", "HTTP/1.1 2000 OK",
                              "HTTP/1.1 099 x", "HTTP/2 200 OK", "HTTP/1.1  200 OK", "HTTP/1.1 200 O\u{1}K", "HTTP/1.2 200 OK", "HTTP/1.1 20 OK"]

    static func response(_ random: inout SplitMix64, head: Bool) -> [UInt8] {
        let weird = RequestGenerator.chance(30, &random)
        let line = weird ? RequestGenerator.pick(statusLines, &random) : RequestGenerator.pick(Array(statusLines.prefix(4)), &random)
        var text = line + "\r\n"
        var framing = "close"
        for _ in 0..<Int(random.next() % 4) {
            let name = weird ? RequestGenerator.pick(RequestGenerator.names, &random) : RequestGenerator.pick(["Server", "Cache-Control", "Set-Cookie"], &random)
            let value = weird ? RequestGenerator.pick(RequestGenerator.values, &random) : "a"
            if name == "Transfer-Encoding" { framing = "other" }
            if name == "Content-Length" { framing = "other" }
            text += name + ": " + value + "\r\n"
        }
        if framing == "close" {
            switch random.next() % 3 {
            case 0: framing = "length"; text += "Content-Length: 7\r\n"
            case 1: framing = "chunked"; text += "Transfer-Encoding: chunked\r\n"
            default: text += "Connection: close\r\n"
            }
        }
        text += "\r\n"
        let bodyless = head || line.contains(" 204") || line.contains(" 304") || line.contains(" 1")
        if !bodyless {
            switch framing {
            case "length": text += "1234567"
            case "chunked": text += RequestGenerator.chunkedBody(weird, &random)
            default: text += String(repeating: "z", count: Int(random.next() % 9))
            }
        }
        return Array(text.utf8)
    }
}
