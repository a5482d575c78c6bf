import CHiredis
import Foundation
import NIOCore
import NIOEmbedded
import TestSupport
import Testing

@testable import Redis

@Suite("RESP reader and writer")
struct RESPReaderTests {
    /// Every reply in `bytes`, fed in `pieces`, with a protocol error as `nil`.
    static func replies(_ bytes: [UInt8], pieces: [Int] = []) -> [RESPValue]? {
        let (replies, failed) = read(bytes, pieces: pieces)
        return failed ? nil : replies
    }

    /// The replies read before the end of `bytes` or a protocol error, and whether there was one.
    static func read(_ bytes: [UInt8], pieces: [Int] = []) -> (replies: [RESPValue], failed: Bool) {
        var reader = RESPReader()
        var unread = ByteBuffer()
        var replies: [RESPValue] = []
        var start = 0
        for end in pieces.filter({ $0 > 0 && $0 < bytes.count }).sorted() + [bytes.count] where end >= start {
            unread.writeBytes(bytes[start..<end])
            start = end
            do {
                while let reply = try reader.read(from: &unread) { replies.append(reply) }
            } catch {
                return (replies, true)
            }
        }
        return (replies, false)
    }

    @Test("commands are written binary-safe")
    func encode() {
        var buffer = ByteBuffer()
        RESPCodec.encode(["SET", "k", .bytes([0, 13, 10, 255])], into: &buffer)
        #expect(Array(buffer.readableBytesView) == Array("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\n".utf8) + [0, 13, 10, 255] + Array("\r\n".utf8))
    }

    @Test("a reply read one byte at a time is the reply read at once")
    func byteByByte() throws {
        let bytes = Array("*4\r\n$3\r\nfoo\r\n:42\r\n$-1\r\n*2\r\n+OK\r\n-ERR bad\r\n*0\r\n".utf8)
        let expected: [RESPValue] = [.array([.bulkString(Array("foo".utf8)), .integer(42), .bulkString(nil), .array([.simpleString("OK"), .error("ERR bad")])]),
                                     .array([])]
        #expect(Self.replies(bytes) == expected)
        #expect(Self.replies(bytes, pieces: Array(1..<bytes.count)) == expected)
    }

    @Test("a bulk string is a slice of the buffer it arrived in, not a copy")
    func zeroCopy() throws {
        var reader = RESPReader()
        var buffer = ByteBuffer(string: "$5\r\nhello\r\n")
        let reply = try #require(try reader.read(from: &buffer))
        guard case .bulkString(let slice?) = reply else { Issue.record("\(reply)"); return }
        let same = buffer.withVeryUnsafeBytes { whole in slice.withUnsafeReadableBytes { $0.baseAddress! == whole.baseAddress! + 4 } }
        #expect(same)
        #expect(String(buffer: slice) == "hello" && buffer.readableBytes == 0)
    }

    @Test("an incomplete reply leaves its bytes unread until the rest arrives",
          arguments: ["$5\r\nhel", "*2\r\n:1\r\n", "+OK\r", ":12", "*1\r\n*1\r\n$3\r\nab"])
    func incomplete(_ prefix: String) throws {
        var reader = RESPReader()
        var buffer = ByteBuffer(string: prefix)
        #expect(try reader.read(from: &buffer) == nil)
    }

    @Test("what Redis never sends is a protocol error", arguments: [
        "?what\r\n", ":\r\n", ":1x\r\n", ":01\r\n", ":-0\r\n", ":+1\r\n", ":99999999999999999999\r\n",
        "$-2\r\n", "$x\r\n", "$03\r\nabc\r\n", "$3\r\nabcd\r\n", "$536870913\r\n", "*-2\r\n", "*x\r\n",
        // RESP3 types: the gateway never asks for RESP3.
        "_\r\n", ",1.5\r\n", "#t\r\n", "%1\r\n+a\r\n+b\r\n", ">1\r\n+a\r\n",
        // Nested deeper than hiredis reads (and than any reply the gateway asks for).
        String(repeating: "*1\r\n", count: 9) + ":1\r\n", String(repeating: "*1\r\n", count: 8) + "*0\r\n",
    ])
    func refused(_ input: String) {
        #expect(Self.replies(Array(input.utf8)) == nil, "\(input.debugDescription)")
    }

    @Test("a line that never ends is refused at 64 KiB, not buffered without end")
    func longLine() {
        #expect(Self.replies(Array(("+" + String(repeating: "a", count: 70_000)).utf8)) == nil)
        #expect(Self.replies(Array(("+" + String(repeating: "a", count: 60_000) + "\r\n").utf8))?.count == 1)
    }

    @Test("a null array and a null bulk string are apart; the extreme integers are read")
    func nullsAndExtremes() {
        #expect(Self.replies(Array("*-1\r\n$-1\r\n:-9223372036854775808\r\n:9223372036854775807\r\n".utf8))
                == [.array(nil), .bulkString(nil), .integer(.min), .integer(.max)])
        #expect(Self.replies(Array(":-9223372036854775809\r\n".utf8)) == nil)
    }

    /// Closes are held back, as TLS holds them while its close_notify goes out.
    final class HeldClose: ChannelOutboundHandler, @unchecked Sendable {
        typealias OutboundIn = Any
        var closes = 0
        var release = false
        func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
            closes += 1
            if release { context.close(mode: mode, promise: promise) }
        }
    }

    @Test("after bytes that are not RESP, a connection still closing reads nothing more and takes no command")
    func brokenConnection() throws {
        let channel = EmbeddedChannel()
        let held = HeldClose()
        let handler = RedisConnectionHandler()
        try channel.pipeline.syncOperations.addHandlers([held, handler])
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 6379)).wait()
        let first = handler.send(["LRANGE", "k", "0", "1"], timeout: .seconds(5), on: channel.eventLoop)
        // Half an array, then garbage: the command fails, the connection is closed.
        try channel.writeInbound(ByteBuffer(string: "*2\r\n:1\r\n?garbage\r\n"))
        #expect(throws: RedisError.protocolError("unexpected reply type 63")) { try first.wait() }
        #expect(held.closes == 1)
        // Still active (the close held back): a new command is refused at once, and a late
        // reply completes nothing (it would otherwise close the half array as [1, 5]).
        let second = handler.send(["GET", "k"], timeout: .seconds(5), on: channel.eventLoop)
        try channel.writeInbound(ByteBuffer(string: ":5\r\n"))
        #expect(throws: RedisError.protocolError("unexpected reply type 63")) { try second.wait() }
        held.release = true
        _ = try? channel.finish()
    }

    @Test("the rest of a reply is kept as a slice of a small read, and copied out of a large one it would pin")
    func restOfAReply() throws {
        for (payload, copied) in [(100, false), (100_000, true)] {
            let channel = EmbeddedChannel()
            let handler = RedisConnectionHandler()
            try channel.pipeline.syncOperations.addHandler(handler)
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 6379)).wait()
            let first = handler.send(["GET", "a"], timeout: .seconds(5), on: channel.eventLoop)
            let second = handler.send(["GET", "b"], timeout: .seconds(5), on: channel.eventLoop)
            // One read: a whole bulk string, then the start of another.
            var read = ByteBuffer(string: "$\(payload)\r\n" + String(repeating: "x", count: payload) + "\r\n$10\r\nabc")
            read.reserveCapacity(max(read.capacity, 1024))
            let storage = read.storageCapacity
            try channel.writeInbound(read)
            #expect(try first.wait().bytes?.count == payload)
            let rest = try #require(handler.unread)
            #expect(rest.readableBytes == 8)
            #expect((rest.storageCapacity < storage) == copied, "payload \(payload): storage \(rest.storageCapacity) of \(storage)")
            try channel.writeInbound(ByteBuffer(string: "defghij\r\n"))
            #expect(try second.wait().string == "abcdefghij")
            #expect(handler.unread == nil)
            _ = try? channel.finish()
        }
    }

    @Test("eight nested arrays are read, as hiredis reads them")
    func depth() {
        let input = String(repeating: "*1\r\n", count: 8) + ":1\r\n"
        var expected = RESPValue.integer(1)
        for _ in 0..<8 { expected = .array([expected]) }
        #expect(Self.replies(Array(input.utf8)) == [expected])
        #expect(HiredisOracle.replies(Array(input.utf8)) == [expected])
    }
}

/// Differential fuzzing of `RESPReader` against hiredis's reader (as `Wire/` is fuzzed against
/// llhttp): generated replies (binary bulk strings with CR and LF inside, nested arrays, nulls,
/// extreme integers) fed in random pieces must read exactly as hiredis reads them; mutated
/// bytes may be refused by ours where hiredis is lenient (a bulk string not ended by CRLF,
/// non-canonical numbers), but whatever ours reads, hiredis must read the same.
///
/// `make test` runs 20,000 cases from a fixed seed; `RESP_FUZZ_SEED` and `RESP_FUZZ_CASES`
/// replay or extend them.
@Suite("RESP reader: differential fuzzing against hiredis")
struct RESPReaderDifferentialTests {
    @Test("generated and mutated replies read as hiredis reads them")
    func differential() {
        let environment = ProcessInfo.processInfo.environment
        let seed = environment["RESP_FUZZ_SEED"].flatMap { UInt64($0) } ?? 0x2E5B_7EAD
        let cases = environment["RESP_FUZZ_CASES"].flatMap { Int($0) } ?? 20_000
        var random = SplitMix64(seed: seed)
        var mutatedAndRead = 0
        for index in 0..<cases {
            var bytes: [UInt8] = []
            for _ in 0...(random.next() % 3) { Self.reply(depth: 0, &random).write(into: &bytes) }
            let mutated = random.next() % 3 == 0
            if mutated { Self.mutate(&bytes, &random) }
            let pieces = (0..<(random.next() % 6)).map { _ in Int(random.next() % UInt64(bytes.count + 1)) }
            // hiredis reads a null array as its one nil: compared as a null bulk string.
            let ours = RESPReaderTests.read(bytes, pieces: pieces)
            let oursMerged = ours.replies.map(\.nullsMerged)
            let theirs = HiredisOracle.read(bytes)
            let what = "case \(index) (RESP_FUZZ_SEED=\(seed)): \(String(decoding: bytes, as: UTF8.self).debugDescription) ours \(ours) hiredis \(theirs)"
            if mutated {
                // Ours may refuse earlier (stricter), never read what hiredis reads otherwise.
                mutatedAndRead += ours.replies.count
                #expect(Array(theirs.replies.prefix(oursMerged.count)) == oursMerged, "\(what)")
                if !theirs.failed { #expect(ours.failed || oursMerged == theirs.replies, "\(what)") }
            } else {
                #expect(!ours.failed && !theirs.failed && oursMerged == theirs.replies, "\(what)")
            }
        }
        #expect(mutatedAndRead > cases / 20, "mutations too destructive to test anything: \(mutatedAndRead)")
    }

    static let integers: [Int64] = [0, 1, -1, 9, 10, -10, 42, 1_000_000_007, Int64.max, Int64.min + 1, 1_764_000_000_000]

    static func reply(depth: Int, _ random: inout SplitMix64) -> RESPValue {
        switch random.next() % (depth < 4 ? 7 : 5) {
        case 0: return .simpleString(["OK", "", "QUEUED", "a\rb"][Int(random.next() % 4)])
        case 1: return .error(["ERR bad", "MOVED 3999 127.0.0.1:6381", "NOSCRIPT No matching script", ""][Int(random.next() % 4)])
        case 2: return random.next() % 2 == 0 ? .integer(integers[Int(random.next() % UInt64(integers.count))]) : .integer(Int64(bitPattern: random.next()) >> 20)
        case 3: return .bulkString(nil)
        case 4:
            let length = [0, 1, 2, 5, 40, 300][Int(random.next() % 6)]
            let alphabet: [UInt8] = [13, 10, 0, 255, 36, 42, 58, 43, 45, 97, 98, 48]
            return .bulkString((0..<length).map { _ in alphabet[Int(random.next() % UInt64(alphabet.count))] })
        case 5: return random.next() % 6 == 0 ? .array(nil) : .array([])
        default: return .array((0..<(random.next() % 6)).map { _ in reply(depth: depth + 1, &random) })
        }
    }

    static func mutate(_ bytes: inout [UInt8], _ random: inout SplitMix64) {
        let interesting: [UInt8] = [13, 10, 0x30, 0x31, 0x2D, 0x2B, 0x24, 0x2A, 0x3A, 0x5F, 0x23, 0x20, 0xFF]
        for _ in 0...(random.next() % 2) where !bytes.isEmpty {
            let at = Int(random.next() % UInt64(bytes.count))
            switch random.next() % 3 {
            case 0: bytes[at] = interesting[Int(random.next() % UInt64(interesting.count))]
            case 1: bytes.remove(at: at)
            default: bytes.insert(interesting[Int(random.next() % UInt64(interesting.count))], at: at)
            }
        }
    }
}

extension RESPValue {
    /// A null array as a null bulk string (hiredis has one nil for both), throughout.
    var nullsMerged: RESPValue {
        switch self {
        case .array(nil): return .bulkString(nil)
        case .array(let items?): return .array(items.map(\.nullsMerged))
        default: return self
        }
    }

    /// The reply as Redis writes it.
    func write(into bytes: inout [UInt8]) {
        switch self {
        case .simpleString(let s): bytes += Array("+\(s)\r\n".utf8)
        case .error(let s): bytes += Array("-\(s)\r\n".utf8)
        case .integer(let n): bytes += Array(":\(n)\r\n".utf8)
        case .bulkString(nil): bytes += Array("$-1\r\n".utf8)
        case .bulkString(let b?): bytes += Array("$\(b.readableBytes)\r\n".utf8) + Array(b.readableBytesView) + [13, 10]
        case .array(nil): bytes += Array("*-1\r\n".utf8)
        case .array(let items?):
            bytes += Array("*\(items.count)\r\n".utf8)
            for item in items { item.write(into: &bytes) }
        }
    }
}

/// hiredis's reader (the system's libhiredis) as the reference: its reply tree, as `RESPValue`s;
/// nil where it reports a protocol error or builds a type RESP2 does not have.
enum HiredisOracle {
    static func replies(_ bytes: [UInt8]) -> [RESPValue]? {
        let (replies, failed) = read(bytes)
        return failed ? nil : replies
    }

    static func read(_ bytes: [UInt8]) -> (replies: [RESPValue], failed: Bool) {
        let reader = redisReaderCreate()!
        defer { redisReaderFree(reader) }
        bytes.withUnsafeBufferPointer { raw in
            _ = raw.withMemoryRebound(to: CChar.self) { redisReaderFeed(reader, $0.baseAddress, $0.count) }
        }
        var replies: [RESPValue] = []
        while true {
            var reply: UnsafeMutableRawPointer? = nil
            if redisReaderGetReply(reader, &reply) != REDIS_OK || sg_redis_reader_failed(reader) != 0 { return (replies, true) }
            guard let reply else { return (replies, false) }
            defer { freeReplyObject(reply) }
            guard let value = value(reply.assumingMemoryBound(to: redisReply.self)) else { return (replies, true) }
            replies.append(value)
        }
    }

    static func value(_ reply: UnsafePointer<redisReply>) -> RESPValue? {
        let r = reply.pointee
        let text = { String(decoding: UnsafeRawBufferPointer(start: r.str, count: Int(r.len)), as: UTF8.self) }
        switch r.type {
        case REDIS_REPLY_STATUS: return .simpleString(text())
        case REDIS_REPLY_ERROR: return .error(text())
        case REDIS_REPLY_INTEGER: return .integer(Int64(r.integer))
        case REDIS_REPLY_STRING: return .bulkString(Array(UnsafeRawBufferPointer(start: r.str, count: Int(r.len))))
        case REDIS_REPLY_NIL: return .bulkString(nil)
        case REDIS_REPLY_ARRAY:
            var elements: [RESPValue] = []
            for i in 0..<Int(r.elements) {
                guard let element = r.element[i], let value = value(element) else { return nil }
                elements.append(value)
            }
            return .array(elements)
        default: return nil
        }
    }
}
