import NIOCore
import Testing

@testable import HTTPProxy

/// The GOAWAY watcher's scanner follows frames across any write boundaries and tells a GOAWAY
/// with an error code from everything else.
@Suite("HTTP/2 frame scanner")
struct HTTP2FrameScannerTests {
    static func frame(type: UInt8, stream: UInt32 = 0, _ payload: [UInt8]) -> [UInt8] {
        let length = payload.count
        return [UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF), type, 0,
                UInt8(stream >> 24), UInt8(stream >> 16 & 0xFF), UInt8(stream >> 8 & 0xFF), UInt8(stream & 0xFF)] + payload
    }

    static func goAway(last: UInt32, code: UInt32, debug: [UInt8] = []) -> [UInt8] {
        frame(type: 7, [UInt8(last >> 24), UInt8(last >> 16 & 0xFF), UInt8(last >> 8 & 0xFF), UInt8(last & 0xFF),
                        UInt8(code >> 24), UInt8(code >> 16 & 0xFF), UInt8(code >> 8 & 0xFF), UInt8(code & 0xFF)] + debug)
    }

    static let settings = frame(type: 4, [0, 3, 0, 0, 0, 100])
    /// A DATA frame whose payload holds the bytes of a GOAWAY with an error: not a GOAWAY.
    static let dataLookingLikeGoAway = frame(type: 0, stream: 1, goAway(last: 1, code: 11))

    /// Scans `bytes` cut into writes of `size` bytes: whether a GOAWAY with an error was seen.
    static func sees(_ bytes: [UInt8], writesOf size: Int) -> Bool {
        var scanner = HTTP2FrameScanner()
        var found = false
        var start = 0
        while start < bytes.count {
            let end = min(start + size, bytes.count)
            if scanner.scan(ByteBuffer(bytes: bytes[start..<end])) { found = true }
            start = end
        }
        return found
    }

    @Test("whatever the write boundaries, only a GOAWAY with an error code is seen", arguments: [
        ("SETTINGS, then DATA carrying GOAWAY's bytes", settings + dataLookingLikeGoAway, false),
        ("GOAWAY NO_ERROR (an idle or drain close)", settings + goAway(last: 3, code: 0), false),
        ("GOAWAY ENHANCE_YOUR_CALM after DATA", dataLookingLikeGoAway + goAway(last: 0, code: 11), true),
        ("GOAWAY PROTOCOL_ERROR with debug data", settings + goAway(last: 5, code: 1, debug: Array("bad".utf8)), true),
    ] as [(String, [UInt8], Bool)])
    func scans(_ name: String, _ bytes: [UInt8], _ expected: Bool) {
        for size in [1, 2, 5, 9, 10, 17, bytes.count] {
            #expect(Self.sees(bytes, writesOf: size) == expected, "\(name), writes of \(size) bytes")
        }
    }
}
