#if canImport(Glibc)
import Glibc
#endif

/// A blocking TCP client with a receive timeout, for byte-exact HTTP/1.1 tests.
/// Used by one thread at a time; tests hand it between threads explicitly.
public final class RawClient: @unchecked Sendable {
    /// -1 once closed: a throwing class initializer still runs `deinit`, and a second close()
    /// of a number another thread has reused (glibc's netlink socket) aborts the process.
    public private(set) var fd: Int32
    private var buffer: [UInt8] = []
    public private(set) var eof = false

    public struct Response: Sendable {
        public var status: Int
        public var headers: [(String, String)]
        public var body: [UInt8]
        /// Statuses of interim (1xx) responses that came first.
        public var interim: [Int] = []
        public var text: String { String(decoding: body, as: UTF8.self) }
        public func header(_ name: String) -> String? { headers.first { $0.0.lowercased() == name.lowercased() }?.1 }
    }

    public enum Failure: Error { case connect(Int32), timeout, closed, malformed(String) }

    /// `source`: the loopback address to connect from (another client, as the gateway sees it);
    /// `host`: the one to connect to.
    public init(port: Int, timeoutSeconds: Int = 10, source: String? = nil, host: String = "127.0.0.1") throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        // bind (to `source`, when given), then connect; either failing closes the socket.
        var rc: Int32 = 0
        if let source {
            var local = sockaddr_in()
            local.sin_family = sa_family_t(AF_INET)
            local.sin_addr.s_addr = inet_addr(source)
            rc = withUnsafePointer(to: &local) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        }
        if rc == 0 {
            var addr = sockaddr_in()
            addr.sin_family = sa_family_t(AF_INET)
            addr.sin_port = in_port_t(UInt16(port).bigEndian)
            addr.sin_addr.s_addr = inet_addr(host)
            rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        }
        if rc != 0 {
            let e = errno
            close(fd)
            fd = -1
            throw Failure.connect(e)
        }
    }

    /// The accepted end of a connection (`RawListener`), with the same receive timeout.
    public init(adopting fd: Int32, timeoutSeconds: Int = 10) {
        self.fd = fd
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { if fd >= 0 { close(fd) } }

    /// Closes the socket now, both ways (the peer sees a FIN).
    public func disconnect() {
        guard fd >= 0 else { return }
        close(fd)
        fd = -1
    }

    public func send(_ text: String) throws { try send(Array(text.utf8)) }

    public func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { throw Failure.closed }
            offset += n
        }
    }

    /// Reads more bytes into the buffer; false at end of stream.
    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n = recv(fd, &chunk, chunk.count, 0)
        if n == 0 { eof = true; return false }
        if n < 0 { if errno == EAGAIN || errno == EWOULDBLOCK { throw Failure.timeout }; eof = true; return false }
        buffer += chunk[0..<n]
        return true
    }

    /// One line, without its CRLF (or LF).
    public func readLine() throws -> String {
        while true {
            if let i = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                var line = Array(buffer[..<i])
                buffer.removeFirst(i + 1)
                if line.last == UInt8(ascii: "\r") { line.removeLast() }
                return String(decoding: line, as: UTF8.self)
            }
            guard try fill() else { throw Failure.closed }
        }
    }

    private func readExactly(_ n: Int) throws -> [UInt8] {
        while buffer.count < n { guard try fill() else { throw Failure.closed } }
        let out = Array(buffer[..<n])
        buffer.removeFirst(n)
        return out
    }

    /// Reads one response. `head: true` for a response to HEAD (no body).
    public func readResponse(head: Bool = false, discardBody: Bool = false) throws -> Response {
        var status = 0
        var headers: [(String, String)] = []
        var interim: [Int] = []
        repeat {
            if status != 0 { interim.append(status) }
            let statusLine = try readLine()
            let parts = statusLine.split(separator: " ", maxSplits: 2)
            guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let code = Int(parts[1]) else { throw Failure.malformed(statusLine) }
            status = code
            headers = []
            while true {
                let line = try readLine()
                if line.isEmpty { break }
                guard let colon = line.firstIndex(of: ":") else { throw Failure.malformed(line) }
                headers.append((String(line[..<colon]), String(line[line.index(after: colon)...]).trimmingSpaces()))
            }
        } while status >= 100 && status < 200 && status != 101
        var response = Response(status: status, headers: headers, body: [], interim: interim)
        if head || status == 204 || status == 304 || status == 101 { return response }
        if let te = response.header("transfer-encoding"), te.lowercased() == "chunked" {
            while true {
                let sizeLine = try readLine()
                guard let size = Int(sizeLine.split(separator: ";").first.map(String.init) ?? "", radix: 16) else { throw Failure.malformed(sizeLine) }
                if size == 0 { _ = try readLine(); break }
                let data = try readExactly(size)
                if !discardBody { response.body += data }
                _ = try readLine()
            }
        } else if let cl = response.header("content-length"), let n = Int(cl) {
            var remaining = n
            while remaining > 0 {
                if buffer.isEmpty { guard try fill() else { throw Failure.closed } }
                let take = min(remaining, buffer.count)
                if !discardBody { response.body += buffer[..<take] }
                buffer.removeFirst(take)
                remaining -= take
            }
        } else {
            while try fill() {}
            if !discardBody { response.body = buffer }
            buffer = []
        }
        return response
    }

    /// Everything up to and including `marker` (e.g. the end of a head).
    public func readUntil(_ marker: String) throws -> [UInt8] {
        let needle = Array(marker.utf8)
        while true {
            if buffer.count >= needle.count, let start = (0...(buffer.count - needle.count)).first(where: { buffer[$0..<$0 + needle.count].elementsEqual(needle) }) {
                return try readExactly(start + needle.count)
            }
            guard try fill() else { throw Failure.closed }
        }
    }

    /// Bytes already received and not yet consumed, plus whatever arrives until `count`.
    public func read(count: Int) throws -> [UInt8] { try readExactly(count) }

    /// True if the peer closes the connection (within the receive timeout) without sending more.
    public func waitForClose() -> Bool {
        if eof { return true }
        while true {
            do { if try !fill() { return true } } catch { return false }
        }
    }
}

extension String {
    fileprivate func trimmingSpaces() -> String {
        var s = Substring(self)
        while s.first == " " || s.first == "\t" { s = s.dropFirst() }
        while s.last == " " || s.last == "\t" { s = s.dropLast() }
        return String(s)
    }
}
