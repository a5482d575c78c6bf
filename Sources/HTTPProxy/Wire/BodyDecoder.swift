import NIOCore

/// Reads one message body from received bytes, as its framing says (RFC 9112 §6–§7): a length,
/// chunks (with their extensions skipped and trailers read), or everything until the
/// connection closes (responses only). Body parts are slices of the received buffers, never
/// copies.
///
/// Chunked framing is bounded: chunk-size lines, extensions, CRLFs and trailers may take 64
/// bytes per chunk plus 4 KiB in all; beyond that a peer is sending framing, not a body
/// (`5;aaaa…` forever), and it is refused. Trailer fields follow the head's rules.
struct BodyDecoder {
    enum Framing: Equatable {
        case contentLength(Int)
        case chunked
        /// Until the connection closes (a response without length or chunking).
        case untilClose
    }

    enum Part: Equatable {
        case body(ByteBuffer)
        /// The body is complete; trailers of a chunked body, if any were sent.
        case end(WireTrailers?)
    }

    private enum State {
        case length(remaining: Int)
        case chunkSize
        case chunkData(remaining: Int)
        case chunkDataEnd
        case trailers
        case untilClose
        case done
    }

    private var state: State
    /// Chunked framing: bytes spent on framing so far, and chunks seen.
    private var framingBytes = 0
    private var chunks = 0
    let maxFields: Int

    static let framingSlack = 4096
    static let framingPerChunk = 64

    init(_ framing: Framing, maxFields: Int = 100) {
        switch framing {
        case .contentLength(let length): state = .length(remaining: length)
        case .chunked: state = .chunkSize
        case .untilClose: state = .untilClose
        }
        self.maxFields = maxFields
    }

    var isDone: Bool {
        if case .done = state { return true }
        return false
    }

    /// The next part from the front of `buffer`; nil when more bytes are needed. After `.end`
    /// nothing more is taken from the buffer (the next message's bytes stay in it).
    mutating func next(_ buffer: inout ByteBuffer) throws(WireError) -> Part? {
        while true {
            switch state {
            case .done:
                return nil
            case .length(let remaining):
                if remaining == 0 {
                    state = .done
                    return .end(nil)
                }
                guard buffer.readableBytes > 0 else { return nil }
                let count = min(remaining, buffer.readableBytes)
                state = .length(remaining: remaining - count)
                return .body(buffer.readSlice(length: count)!)
            case .untilClose:
                guard buffer.readableBytes > 0 else { return nil }
                return .body(buffer.readSlice(length: buffer.readableBytes)!)
            case .chunkSize:
                guard let (lineLength, size) = try readChunkSize(buffer) else { return nil }
                buffer.moveReaderIndex(forwardBy: lineLength)
                chunks += 1
                try spend(lineLength)
                state = size == 0 ? .trailers : .chunkData(remaining: size)
            case .chunkData(let remaining):
                guard buffer.readableBytes > 0 else { return nil }
                let count = min(remaining, buffer.readableBytes)
                state = count == remaining ? .chunkDataEnd : .chunkData(remaining: remaining - count)
                return .body(buffer.readSlice(length: count)!)
            case .chunkDataEnd:
                guard buffer.readableBytes >= 2 else { return nil }
                guard buffer.getInteger(at: buffer.readerIndex, as: UInt16.self) == 0x0D0A else {
                    throw .malformed("chunk data not followed by CRLF")
                }
                buffer.moveReaderIndex(forwardBy: 2)
                try spend(2)
                state = .chunkSize
            case .trailers:
                guard let (length, trailers) = try readTrailers(buffer) else { return nil }
                buffer.moveReaderIndex(forwardBy: length)
                try spend(length)
                state = .done
                return .end(trailers)
            }
        }
    }

    /// The connection closed after the bytes given so far: the end of a body read until close;
    /// for any other framing the body is truncated.
    mutating func finish() throws(WireError) -> Part {
        switch state {
        case .untilClose:
            state = .done
            return .end(nil)
        case .done:
            throw .malformed("no body in progress")
        default:
            throw .malformed("connection closed within the body")
        }
    }

    private mutating func spend(_ bytes: Int) throws(WireError) {
        framingBytes += bytes
        if framingBytes > Self.framingSlack + Self.framingPerChunk * chunks {
            throw .malformed("chunked framing too large")
        }
    }

    /// `chunk-size [chunk-ext] CRLF`: the line's length and the size, nil while incomplete.
    private func readChunkSize(_ buffer: ByteBuffer) throws(WireError) -> (Int, Int)? {
        let budget = Self.framingSlack + Self.framingPerChunk * (chunks + 1) - framingBytes
        let result: Result<(Int, Int)?, WireError> = buffer.withUnsafeReadableBytes { raw in
            var p = 0
            var size = 0
            while p < raw.count, let digit = Self.hexValue(raw[p]) {
                guard p < 15 else { return .failure(.malformed("chunk size too large")) }
                size = size << 4 | digit
                p += 1
            }
            if p == raw.count { return raw.count > budget ? .failure(.malformed("chunked framing too large")) : .success(nil) }
            guard p > 0 else { return .failure(.malformed("invalid chunk size")) }
            // chunk-ext = *( ";" token [ "=" ( token / quoted-string ) ] ), skipped; bounded by
            // the budget.
            while p < raw.count, raw[p] == 0x3B {
                let scan = Self.chunkExtension(raw, from: p + 1)
                switch scan {
                case .end(let next): p = next
                case .incomplete: return raw.count > budget ? .failure(.malformed("chunked framing too large")) : .success(nil)
                case .invalid: return .failure(.malformed("invalid chunk extension"))
                }
            }
            guard p == raw.count || raw[p] == 0x0D else { return .failure(.malformed("invalid chunk size line")) }
            guard p + 1 < raw.count else { return raw.count > budget ? .failure(.malformed("chunked framing too large")) : .success(nil) }
            guard raw[p + 1] == 0x0A else { return .failure(.malformed("invalid chunk size line")) }
            return .success((p + 2, size))
        }
        return try result.get()
    }

    /// `*( field-line CRLF ) CRLF` after the last chunk: its length and the fields, nil while
    /// incomplete (read again from the start: the budget bounds them to a few KiB).
    private func readTrailers(_ buffer: ByteBuffer) throws(WireError) -> (Int, WireTrailers?)? {
        let budget = Self.framingSlack + Self.framingPerChunk * chunks - framingBytes
        let found: Result<Int?, WireError> = buffer.withUnsafeReadableBytes { raw in
            var lineStart = 0
            while let newline = raw[lineStart...].firstIndex(of: 0x0A) {
                guard newline > lineStart, raw[newline - 1] == 0x0D else { return .failure(.malformed("trailer line not ended by CRLF")) }
                if newline - 1 == lineStart { return .success(newline + 1) }
                lineStart = newline + 1
            }
            return raw.count > budget ? .failure(.malformed("chunked framing too large")) : .success(nil)
        }
        guard let end = try found.get() else { return nil }
        if end == 2 { return (2, nil) }
        let bytes = buffer.getSlice(at: buffer.readerIndex, length: end)!
        let fields: [WireField]? = bytes.withUnsafeReadableBytes { raw in
            var p = 0
            var fields: [WireField] = []
            while p + 2 < raw.count {
                guard let field = HeadParser.readField(raw, &p) else { return nil }
                fields.append(field)
            }
            return fields
        }
        guard let fields else { throw .malformed("invalid trailer field") }
        guard fields.count <= maxFields else { throw .tooLarge("more than \(maxFields) trailer fields") }
        return (end, WireTrailers(bytes: bytes, fields: fields))
    }

    private enum Scan {
        case end(Int)
        /// Cut short by the end of what has arrived.
        case incomplete
        case invalid
    }

    /// One extension after its `;`: `token [ "=" ( token / quoted-string ) ]`.
    private static func chunkExtension(_ raw: UnsafeRawBufferPointer, from start: Int) -> Scan {
        var p = start
        while p < raw.count, HeadParser.isToken(raw[p]) { p += 1 }
        if p == raw.count { return .incomplete }
        guard p > start else { return .invalid }
        guard raw[p] == 0x3D else { return .end(p) }
        p += 1
        if p == raw.count { return .incomplete }
        if raw[p] != 0x22 {
            let valueStart = p
            while p < raw.count, HeadParser.isToken(raw[p]) { p += 1 }
            if p == raw.count { return .incomplete }
            return p > valueStart ? .end(p) : .invalid
        }
        // quoted-string (RFC 9110 §5.6.4)
        p += 1
        while p < raw.count {
            switch raw[p] {
            case 0x22: return .end(p + 1)
            case 0x5C:
                if p + 1 == raw.count { return .incomplete }
                guard raw[p + 1] == 0x09 || raw[p + 1] == 0x20 || HeadParser.isFieldByte(raw[p + 1]) else { return .invalid }
                p += 2
            case 0x09, 0x20, 0x21, 0x23...0x5B, 0x5D...0x7E, 0x80...0xFF: p += 1
            default: return .invalid
            }
        }
        return .incomplete
    }

    @inline(__always)
    private static func hexValue(_ byte: UInt8) -> Int? {
        switch byte {
        case 0x30...0x39: return Int(byte - 0x30)
        case 0x41...0x46: return Int(byte - 0x41 + 10)
        case 0x61...0x66: return Int(byte - 0x61 + 10)
        default: return nil
        }
    }
}

/// The trailer fields of a chunked body, as received.
struct WireTrailers: Equatable {
    var bytes: ByteBuffer
    var fields: [WireField]

    func name(_ field: WireField) -> String { bytes.getString(at: bytes.readerIndex + Int(field.nameStart), length: Int(field.nameLength)) ?? "" }
    func value(_ field: WireField) -> String { bytes.getString(at: bytes.readerIndex + Int(field.valueStart), length: Int(field.valueLength)) ?? "" }
}
