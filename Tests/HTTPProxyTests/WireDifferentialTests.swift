import Foundation
#if canImport(Glibc)
import Glibc
#endif
import NIOCore
import NIOEmbedded
import NIOHTTP1
import TestSupport
import Testing

@testable import HTTPProxy

/// Differential fuzzing of the wire engine's request parsing (`RequestReader`: `HeadParser`, `MessageFraming`,
/// `BodyDecoder`) against NIO's llhttp-based `HTTPRequestDecoder`: generated and mutated byte
/// streams (one or two pipelined requests) go to both, fed in random pieces to ours; any
/// disagreement in accept/reject, method, target, version, header names and values, body bytes
/// or trailers fails, unless ours is stricter on purpose for a reason listed in
/// `stricterOnPurpose`.
///
/// `make test` runs 50,000 cases from a fixed seed; `make fuzz` runs open-ended from a random
/// seed (`WIRE_FUZZ_SEED`, `WIRE_FUZZ_CASES`) and prints the seed and input of any failure.
@Suite("Wire engine: differential fuzzing against NIO's llhttp decoder")
struct WireDifferentialTests {
    /// One request as a parser understood it.
    struct Message: Equatable, CustomStringConvertible {
        var method: String
        var target: String
        var version: String
        var headers: [String]
        var body: [UInt8]
        var trailers: [String]?

        var description: String { "\(method) \(target) \(version) \(headers) body=\(body.count)B trailers=\(trailers ?? [])" }
    }

    struct Outcome: Equatable, CustomStringConvertible {
        var messages: [Message] = []
        var rejected = false
        /// Ours: why it refused (not compared).
        var reason: String? = nil
        /// llhttp: the head of a message still incomplete at the end of the input (not compared).
        var pending: Message? = nil

        static func == (a: Outcome, b: Outcome) -> Bool { a.messages == b.messages && a.rejected == b.rejected }
        var description: String { "\(rejected ? "REJECTED after " : "")\(messages)" }
    }

    // MARK: the two parsers

    static func reference(_ input: [UInt8]) -> Outcome {
        let channel = EmbeddedChannel()
        defer { _ = try? channel.finish() }
        var outcome = Outcome()
        do {
            try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes)))
            try channel.writeInbound(channel.allocator.buffer(bytes: input))
        } catch {
            outcome.rejected = true
        }
        var parts: [HTTPServerRequestPart] = []
        while let part = try? channel.readInbound(as: HTTPServerRequestPart.self) { parts.append(part) }
        collect(parts, into: &outcome) { head in
            Message(method: head.method.rawValue, target: head.uri, version: "\(head.version)", headers: lines(head.headers), body: [], trailers: nil)
        }
        return outcome
    }

    /// What NIO's decoder delivered, as messages; the head of one left incomplete is `pending`.
    static func collect<Head>(_ parts: [HTTPPart<Head, ByteBuffer>], into outcome: inout Outcome, _ message: (Head) -> Message) {
        var current: Message? = nil
        for part in parts {
            switch part {
            case .head(let head):
                current = message(head)
            case .body(let buffer):
                current?.body += buffer.readableBytesView
            case .end(let trailers):
                if var message = current {
                    message.trailers = trailers.map(lines)
                    outcome.messages.append(message)
                }
                current = nil
            }
        }
        outcome.pending = current
    }

    /// `name: value` lines. llhttp keeps a value's trailing OWS; ours trims it (RFC 9110 §5.5:
    /// not part of the value): compared without it.
    static func lines(_ headers: HTTPHeaders) -> [String] {
        headers.map { "\($0.name): \(trimmed($0.value))" }
    }

    /// Ours, fed in the pieces `splits` cuts (offsets into `input`).
    static func ours(_ input: [UInt8], splits: [Int]) -> Outcome {
        var outcome = Outcome()
        var reader = RequestReader(maxHeadBytes: 80 * 1024, maxFields: 1000)
        var current: Message? = nil
        let cuts = splits.filter { $0 > 0 && $0 < input.count }.sorted() + [input.count]
        var from = 0
        do {
            for cut in cuts {
                reader.receive(ByteBuffer(bytes: input[from..<cut]))
                from = cut
                while let part = try reader.next() {
                    switch part {
                    case .head(let head):
                        current = Message(method: head.method.rawValue, target: head.target, version: "\(head.version)",
                                          headers: head.fields.map { "\(head.name($0)): \(head.value($0))" }, body: [], trailers: nil)
                    case .body(let bytes):
                        current?.body += bytes.readableBytesView
                    case .end(let trailers):
                        let message = complete(&current, trailers, into: &outcome)
                        // NIO stops at an upgrade request, the proxy after a closing one.
                        if isUpgrade(message) || !keepsAlive(message) { return outcome }
                    }
                }
            }
        } catch {
            outcome.rejected = true
            outcome.reason = "\(error)"
        }
        return outcome
    }

    /// The message being read is complete: its trailers noted, it joins the outcome.
    static func complete(_ current: inout Message?, _ trailers: WireTrailers?, into outcome: inout Outcome) -> Message {
        var message = current!
        current = nil
        message.trailers = trailers.map { t in t.fields.map { "\(t.name($0)): \(t.value($0))" } }
        outcome.messages.append(message)
        return message
    }

    /// Whether the connection stays open after `message` (RFC 9112 §9.3).
    static func keepsAlive(_ message: Message) -> Bool {
        let tokens = values(message, "connection").flatMap { $0.lowercased().split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } }
        return message.version == "HTTP/1.1" ? !tokens.contains("close") : tokens.contains("keep-alive")
    }

    /// What is compared: nothing after a message that closes the connection (llhttp refuses
    /// any byte after it; the proxy closes after answering it and reads no further).
    static func comparable(_ outcome: Outcome) -> Outcome {
        guard let last = outcome.messages.firstIndex(where: { !keepsAlive($0) || isUpgrade($0) }) else { return outcome }
        return Outcome(messages: Array(outcome.messages.prefix(last + 1)), rejected: false, reason: outcome.reason)
    }

    static func trimmed(_ value: String) -> String {
        var value = Substring(value)
        while let last = value.last, last == " " || last == "\t" { value = value.dropLast() }
        return String(value)
    }

    static func isUpgrade(_ message: Message) -> Bool {
        message.method == "CONNECT" || message.headers.contains { $0.lowercased().hasPrefix("upgrade:") }
    }

    // MARK: where ours is stricter on purpose

    /// A rule ours applies that llhttp does not: applies to the message llhttp accepted and ours
    /// refused.
    struct Stricter: Sendable {
        let name: String
        let reason: String
        /// The message llhttp accepted and ours refused (nil: ours refused bytes llhttp skipped),
        /// the input, and why ours refused.
        let applies: @Sendable (_ message: Message?, _ raw: [UInt8], _ reason: String) -> Bool
    }

    static func values(_ message: Message?, _ name: String) -> [String] {
        (message?.headers ?? []).compactMap { line in
            let parts = line.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.count == 2, parts[0].lowercased() == name else { return nil }
            return String(parts[1].dropFirst())
        }
    }

    static let stricterOnPurpose: [Stricter] = [
        Stricter(name: "duplicate Content-Length", reason: "two lengths, even equal ones, are a smuggling vector (RFC 9112 §6.3 allows refusing)") {
            m, _, _ in values(m, "content-length").count > 1
        },
        Stricter(name: "Content-Length not plain digits", reason: "a list, sign or space is read differently by other parsers") {
            m, _, _ in values(m, "content-length").contains { v in v.isEmpty || v.count > 18 || !v.allSatisfy(\.isASCIIDigitCharacter) }
        },
        Stricter(name: "Transfer-Encoding other than exactly chunked, or twice", reason: "the proxy forwards only what it can re-frame; anything else is refused, not guessed") {
            m, _, _ in let te = values(m, "transfer-encoding"); return te.count > 1 || te.contains { $0.lowercased() != "chunked" }
        },
        Stricter(name: "Transfer-Encoding with Content-Length", reason: "RFC 9112 §6.1: a server may refuse; the proxy does rather than pick one") {
            m, _, _ in !values(m, "transfer-encoding").isEmpty && !values(m, "content-length").isEmpty
        },
        Stricter(name: "more than one SP in the request line", reason: "RFC 9112 §3: exactly one SP; llhttp skips extra ones, a backend may read a different target") {
            m, raw, _ in m.map { m in String(decoding: raw, as: UTF8.self).components(separatedBy: "\r\n").contains { $0.contains(m.target) && $0.contains(" HTTP/") && $0.contains("  ") } } ?? false
        },
        Stricter(name: "a bare LF or CR", reason: "llhttp skips a lone LF or CR before a request line; here every line ends in CRLF and nothing else is skipped (a backend that splits on LF alone reads other requests)") {
            _, _, reason in reason == "line not ended by CRLF" || reason == "bare CR"
        },
        Stricter(name: "asterisk form followed by more", reason: "RFC 9112 §3.2.4: the asterisk form is exactly \"*\"") {
            m, _, _ in m.map { $0.target.hasPrefix("*") && $0.target != "*" } ?? false
        },
        Stricter(name: "Transfer-Encoding in HTTP/1.0", reason: "RFC 9112 §6.1: an HTTP/1.0 message with chunking is to be treated as faulty framing") {
            m, _, _ in m?.version == "HTTP/1.0" && !values(m, "transfer-encoding").isEmpty
        },
    ]

    // MARK: the run

    struct Report: Sendable {
        var ran = 0
        var accepted = 0
        var stricterSeen: [String: Int] = [:]
        var failures: [String] = []

        /// Counts one case: equal, explained by a listed rule, or a failure; false once ten
        /// failures are recorded.
        mutating func tally(_ expected: Outcome, _ got: Outcome, explained: () -> String?, case describe: () -> String) -> Bool {
            ran += 1
            if !expected.rejected { accepted += 1 }
            guard got != expected else { return true }
            if let rule = explained() {
                stricterSeen[rule, default: 0] += 1
                return true
            }
            failures.append("\(describe())\n  llhttp: \(expected)\n  ours:   \(got)")
            return failures.count < 10
        }
    }

    /// `cases` cases from `seed`, stopping at the tenth disagreement.
    static func run(seed: UInt64, cases: Int) -> Report {
        var random = SplitMix64(seed: seed)
        var report = Report()
        for index in 0..<cases {
            let input = RequestGenerator.input(&random)
            let splits = (0..<Int(random.next() % 4)).map { _ in Int(random.next() % UInt64(max(input.count, 1))) }
            let expected = comparable(reference(input))
            let got = comparable(ours(input, splits: splits))
            let more = report.tally(expected, got, explained: { explained(expected: expected, got: got, input: input) },
                                    case: { "case \(index) (WIRE_FUZZ_SEED=\(seed)): \(String(decoding: input, as: UTF8.self).debugDescription)" })
            if !more { break }
        }
        return report
    }

    @Test("generated and mutated requests parse the same, or ours is stricter for a listed reason")
    func differential() async throws {
        try await Self.fuzz("requests", defaultCases: 50_000, Self.run)
    }

    /// Runs `run` for `WIRE_FUZZ_SEED` and `WIRE_FUZZ_CASES` (else a fixed seed and
    /// `defaultCases`) on a thread of its own at the lowest priority (seconds of CPU; the run
    /// shares two cooperative threads and two cores), and records every disagreement.
    static func fuzz(_ what: String, defaultCases: Int, _ run: @escaping @Sendable (UInt64, Int) -> Report) async throws {
        let environment = ProcessInfo.processInfo.environment
        let seed = environment["WIRE_FUZZ_SEED"].flatMap { UInt64($0) } ?? 0x5E55_1016_A7E
        let cases = environment["WIRE_FUZZ_CASES"].flatMap { Int($0) } ?? defaultCases
        let report = try await blocking { () -> Report in
            // Niced, so that the timing-sensitive suites running beside it keep their cores.
            _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, 19)  // Linux: 0 is the calling thread
            return run(seed, cases)
        }
        for failure in report.failures { Issue.record(Comment(rawValue: failure)) }
        print("wire differential (\(what)): \(report.ran) cases from seed \(seed), \(report.accepted) accepted by llhttp; ours stricter on purpose: \(report.stricterSeen)")
        #expect(report.accepted > report.ran / 4, "the generator must produce enough valid \(what) to compare anything")
    }

    /// The name of the listed rule that explains a difference, if one does: the messages
    /// before agree, and ours refused where llhttp did not (yet).
    static func explained(expected: Outcome, got: Outcome, input: [UInt8]) -> String? {
        let ending = Array("\r\n\r\n".utf8)
        if !got.rejected {
            // llhttp refuses at the first bad byte; ours when the line's CRLF arrives (or the
            // head outgrows its bound): the same refusal, later. Shown by ending the line.
            guard expected.rejected, got.messages == expected.messages else { return nil }
            let ended = comparable(ours(input + ending, splits: []))
            return ended.rejected && ended.messages == expected.messages ? "refused when the line ends, not at the bad byte" : nil
        }
        guard expected.messages.starts(with: got.messages) else { return nil }
        var expected = expected
        if !expected.rejected, expected.messages.count == got.messages.count {
            // llhttp still reads where ours refused: give it the rest of a head and a body.
            expected = comparable(reference(input + ending + Array(repeating: 0x78, count: 32)))
            if expected.rejected, expected.messages.count == got.messages.count { return "refused at the line, before llhttp refuses the head" }
        }
        let refused = expected.messages.count > got.messages.count ? expected.messages[got.messages.count] : expected.pending
        return stricterOnPurpose.first { $0.applies(refused, input, got.reason ?? "") }?.name
    }
}

extension Character {
    var isASCIIDigitCharacter: Bool { isASCII && isNumber }
}

/// Requests from a grammar with the edge cases that matter for framing, then, for a third of
/// them, byte mutations.
enum RequestGenerator {
    static let methods = ["GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "PATCH", "PROPFIND", "M-SEARCH", "SOURCE", "QUERY",
                          "get", "FOO", "GET_", "PRI", "DESCRIBE"]
    static let targets = ["/", "/a/b?c=d", "*", "http://a/x", "/%2e%2e/", "/a#frag", "/\u{7f}", "/é", "//a", "/a b", "", "/a\tb", "/;x", "/?"]
    static let versions = ["HTTP/1.1", "HTTP/1.0", "HTTP/1.1", "HTTP/1.1", "HTTP/2.0", "HTTP/1.2", "http/1.1", "HTTP/01.1", "HTTP/1.", "HTTP/0.9"]
    static let names = ["Host", "X-A", "Accept", "Cookie", "Connection", "Content-Length", "Transfer-Encoding", "Expect", "User-Agent",
                        "x_b", "X-A ", " X-A", "X:A", "", "Upgrade", "Trailer", "Content-Length", "Transfer-Encoding"]
    static let values = ["a", "", " a ", "a\tb", "chunked", "CHUNKED", "gzip, chunked", "chunked, gzip", "0", "5", "10", "+5", "5, 5",
                         "005", "close", "keep-alive", "100-continue", "a\u{0}b", "a\rb", "é", "\u{7f}", "x\u{1}", "  ", "a\r\n b",
                         "99999999999999999999", "1 2"]
    static let endings = ["\r\n", "\r\n", "\r\n", "\r\n", "\r\n", "\r\n", "\r\n", "\n", "\r", "\r\r\n"]

    static func pick<T>(_ array: [T], _ random: inout SplitMix64) -> T { array[Int(random.next() % UInt64(array.count))] }
    static func chance(_ percent: UInt64, _ random: inout SplitMix64) -> Bool { random.next() % 100 < percent }

    static func input(_ random: inout SplitMix64) -> [UInt8] {
        var bytes = request(&random)
        if chance(15, &random) { bytes += request(&random) }  // pipelined
        if chance(33, &random) { mutate(&bytes, &random) }
        return bytes
    }

    static func request(_ random: inout SplitMix64) -> [UInt8] {
        let weird = chance(30, &random)
        func eol(_ random: inout SplitMix64) -> String { weird ? pick(endings, &random) : "\r\n" }
        var text = ""
        if chance(5, &random) { text += "\r\n" }
        let method = weird ? pick(methods, &random) : pick(Array(methods.prefix(6)), &random)
        let target = weird ? pick(targets, &random) : pick(Array(targets.prefix(3)), &random)
        let version = weird ? pick(versions, &random) : (chance(10, &random) ? "HTTP/1.0" : "HTTP/1.1")
        let space = weird && chance(20, &random) ? "  " : " "
        text += method + space + target + " " + version + eol(&random)
        text += "Host: example.test" + eol(&random)
        var framing = "none"
        for _ in 0..<Int(random.next() % 5) {
            let name = weird ? pick(names, &random) : pick(Array(names.prefix(4)), &random)
            var value = weird ? pick(values, &random) : pick(Array(values.prefix(3)), &random)
            let separator = weird && chance(20, &random) ? pick([":", ":  ", " : ", ":\t"], &random) : ": "
            if name == "Transfer-Encoding", value.lowercased().contains("chunked") { framing = "chunked" }
            if name == "Content-Length", framing == "none" { framing = "length" }
            if name == "Content-Length", Int(value) == nil, !weird { value = "3" }
            text += name + separator + value + eol(&random)
        }
        // A body most of the time framed as declared; sometimes a framing of its own.
        if chance(30, &random) {
            framing = chance(50, &random) ? "chunked" : "length"
            text += framing == "chunked" ? "Transfer-Encoding: chunked\r\n" : "Content-Length: 5\r\n"
        }
        text += eol(&random)
        switch framing {
        case "chunked": text += chunkedBody(weird, &random)
        case "length": text += String(repeating: "x", count: Int(random.next() % 12))
        default: break
        }
        return Array(text.utf8)
    }

    static func chunkedBody(_ weird: Bool, _ random: inout SplitMix64) -> String {
        var text = ""
        for _ in 0..<Int(random.next() % 3) {
            let size = Int(random.next() % 20) + 1
            let sizeText = weird && chance(20, &random) ? pick(["0x5", "+5", "5 ", " 5", "5;a=b", "5;a=\"x\"", "5 ;a", "ffffffffffffffffff", "00005", "5\t"], &random)
                : String(size, radix: 16, uppercase: chance(50, &random))
            let dataSize = Int(sizeText.prefix { $0.isHexDigit }, radix: 16).map { min($0, 64) } ?? size
            text += sizeText + "\r\n" + String(repeating: "y", count: dataSize) + (weird && chance(10, &random) ? "\n" : "\r\n")
        }
        text += weird && chance(20, &random) ? pick(["0;ext=1\r\n", "000\r\n", "0\n", "0 \r\n"], &random) : "0\r\n"
        if chance(20, &random) { text += weird ? pick(["X-T: 1\r\n", "X-T : 1\r\n", "X-T: a\u{0}\r\n", ": x\r\n", " folded\r\n"], &random) : "X-T: 1\r\n" }
        text += weird && chance(10, &random) ? "\n" : "\r\n"
        return text
    }

    /// Flips, inserts, deletes or duplicates a few bytes, favouring the ones framing hinges on.
    static func mutate(_ bytes: inout [UInt8], _ random: inout SplitMix64) {
        let interesting: [UInt8] = [0x0D, 0x0A, 0x20, 0x09, 0x3A, 0x00, 0x7F, 0x80, 0xFF, 0x3B, 0x2C, 0x30, 0x61, 0x22]
        for _ in 0..<Int(random.next() % 3 + 1) where !bytes.isEmpty {
            let at = Int(random.next() % UInt64(bytes.count))
            switch random.next() % 4 {
            case 0: bytes[at] = pick(interesting, &random)
            case 1: bytes.insert(pick(interesting, &random), at: at)
            case 2: bytes.remove(at: at)
            default: bytes[at] ^= UInt8(truncatingIfNeeded: 1 << (random.next() % 8))
            }
        }
    }
}
