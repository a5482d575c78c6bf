import NIOCore

/// A resumable, zero-copy RESP2 reply reader.
///
/// Bytes are read from the caller's buffer; a bulk string becomes a slice of that buffer (no
/// copy), an array one allocation. A reply that has not fully arrived leaves the elements read
/// so far on a stack and its unread bytes in the buffer: the next call goes on from there, so
/// a large reply arriving in many reads is read once, not once per read.
///
/// Stricter than hiredis where hiredis is lenient (the differential tests check that whatever
/// this reader accepts, hiredis reads the same): a bulk string's payload must end in CRLF,
/// lengths and integers are canonical decimals, and RESP3 types are refused (the gateway never
/// asks for RESP3). Limits: bulk strings of up to 512 MiB (Redis's own `proto-max-bulk-len`),
/// arrays nested up to 8 deep. Loops over indices, not generic collection algorithms: the debug
/// build allocates in those, and a Redis miss's allocations are counted there.
///
/// Bytes that are not RESP throw `RedisError.protocolError` with what was wrong.
struct RESPReader {
    static let maximumBulkLength = 512 * 1024 * 1024
    static let maximumDepth = 8
    /// A line (`+`, `-`, `:`, or a length) longer than this without its CRLF is not Redis.
    static let maximumLineLength = 64 * 1024

    /// Arrays being read, outermost first: how many elements each still expects.
    private var open: [(remaining: Int, elements: [RESPValue])] = []

    /// The next complete reply, or nil until more bytes arrive (what was read stays here).
    mutating func read(from buffer: inout ByteBuffer) throws -> RESPValue? {
        while let leaf = try readElement(from: &buffer) {
            // Close every array this value completes; a reply is whole when none is open.
            var value: RESPValue? = leaf
            while let complete = value, !open.isEmpty {
                let last = open.count - 1
                open[last].elements.append(complete)
                open[last].remaining -= 1
                value = open[last].remaining == 0 ? .array(open.removeLast().elements) : nil
            }
            if let value { return value }
        }
        return nil
    }

    /// A scalar, an empty or null array, or nil (incomplete, or an array opened: read on).
    private mutating func readElement(from buffer: inout ByteBuffer) throws -> RESPValue? {
        while true {
            guard let (kind, line, lineEnd) = try Self.line(in: buffer) else { return nil }
            switch kind {
            case .simpleString, .error:
                let text = buffer.getString(at: line.lowerBound, length: line.count) ?? ""
                buffer.moveReaderIndex(to: lineEnd)
                return kind == .simpleString ? .simpleString(text) : .error(text)
            case .integer:
                guard let n = Self.integer(buffer, line) else { throw RedisError.protocolError("bad integer") }
                buffer.moveReaderIndex(to: lineEnd)
                return .integer(n)
            case .bulkString:
                guard let n = Self.integer(buffer, line), n >= -1, n <= Self.maximumBulkLength else {
                    throw RedisError.protocolError("bad bulk string length")
                }
                if n == -1 {
                    buffer.moveReaderIndex(to: lineEnd)
                    return .bulkString(nil)
                }
                let length = Int(n)
                let end = lineEnd + length
                guard buffer.writerIndex >= end + 2 else { return nil }
                guard buffer.getInteger(at: end, as: UInt16.self) == 0x0D0A else {
                    throw RedisError.protocolError("bulk string not ended by CRLF")
                }
                let payload = buffer.getSlice(at: lineEnd, length: length)!
                buffer.moveReaderIndex(to: end + 2)
                return .bulkString(payload)
            case .array:
                guard let n = Self.integer(buffer, line), n >= -1 else { throw RedisError.protocolError("bad array length") }
                guard open.count < Self.maximumDepth else { throw RedisError.protocolError("arrays nested too deep") }
                buffer.moveReaderIndex(to: lineEnd)
                if n == -1 { return .array(nil) }
                if n == 0 { return .array([]) }
                var elements: [RESPValue] = []
                // Never more than the bytes could hold (an element is at least 3 bytes), nor
                // than 4,096 ahead: a hostile count reserves nothing; a large array grows.
                elements.reserveCapacity(min(Int(n), buffer.readableBytes / 3 + 1, 4096))
                open.append((Int(n), elements))
            }
        }
    }

    /// RESP2's reply types, by their first byte.
    private enum Kind: UInt8 {
        case simpleString = 0x2B  // +
        case error = 0x2D  // -
        case integer = 0x3A  // :
        case bulkString = 0x24  // $
        case array = 0x2A  // *
    }

    /// The reply's type, the line's content (after the type, before CRLF) and where the next
    /// element starts; nil until the CRLF has arrived. A type byte that is not RESP2's is
    /// refused at once, not after a line of garbage.
    private static func line(in buffer: ByteBuffer) throws -> (Kind, Range<Int>, Int)? {
        try buffer.withUnsafeReadableBytes { raw -> (Kind, Range<Int>, Int)? in
            guard raw.count > 0 else { return nil }
            guard let type = Kind(rawValue: raw[0]) else { throw RedisError.protocolError("unexpected reply type \(raw[0])") }
            let limit = min(raw.count, maximumLineLength + 2)
            var i = 1
            while i + 1 < limit {
                if raw[i] == 0x0D && raw[i + 1] == 0x0A {
                    let start = buffer.readerIndex
                    return (type, (start + 1)..<(start + i), start + i + 2)
                }
                i += 1
            }
            if raw.count >= maximumLineLength + 2 { throw RedisError.protocolError("line too long") }
            return nil
        }
    }

    private static func integer(_ buffer: ByteBuffer, _ range: Range<Int>) -> Int64? {
        buffer.withUnsafeReadableBytes { raw in
            let base = buffer.readerIndex
            return RESPDecimal.int64(UnsafeRawBufferPointer(rebasing: raw[(range.lowerBound - base)..<(range.upperBound - base)]))
        }
    }
}

/// Redis's decimal numbers: integer replies, lengths, and the numbers a store keeps as bulk
/// strings (`GET`, hash fields). One reader for all of them.
public enum RESPDecimal {
    /// A canonical decimal: `0`, or an optional `-` and digits not starting with 0; fits in
    /// Int64. Anything else (a sign alone, `+1`, `007`, `-0`, spaces, overflow) is nil.
    public static func int64(_ raw: UnsafeRawBufferPointer) -> Int64? {
        var i = 0
        let end = raw.count
        guard i < end else { return nil }
        let negative = raw[i] == UInt8(ascii: "-")
        if negative { i += 1 }
        guard i < end else { return nil }
        if raw[i] == UInt8(ascii: "0") { return !negative && end - i == 1 ? 0 : nil }
        var n: Int64 = 0
        while i < end {
            let d = raw[i] &- 0x30
            guard d <= 9 else { return nil }
            let (m, o1) = n.multipliedReportingOverflow(by: 10)
            let (s, o2) = negative ? m.subtractingReportingOverflow(Int64(d)) : m.addingReportingOverflow(Int64(d))
            guard !o1, !o2 else { return nil }
            n = s
            i += 1
        }
        return n
    }

    /// The readable bytes of `buffer` as a canonical decimal.
    public static func int64(_ buffer: ByteBuffer) -> Int64? { buffer.withUnsafeReadableBytes { int64($0) } }
}
