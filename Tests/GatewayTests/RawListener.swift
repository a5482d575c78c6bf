#if canImport(Glibc)
import Glibc
#endif
import TestSupport

/// A blocking listening socket on loopback, for the app's side of a test that must see which
/// bytes reach the app and when its connection closes (`RawClient.waitForClose` on what
/// `accept` returns, its receive timeout as the upper bound).
final class RawListener: @unchecked Sendable {
    /// -1 once closed (as `RawClient.fd`).
    private var fd: Int32
    let port: Int

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = 0
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &addr) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                bind(fd, address, length) == 0 && listen(fd, 16) == 0 && getsockname(fd, address, &length) == 0
            }
        }
        guard bound else {
            let e = errno
            close(fd)
            throw RawClient.Failure.connect(e)
        }
        self.fd = fd
        port = Int(UInt16(bigEndian: addr.sin_port))
    }

    deinit { if fd >= 0 { close(fd) } }

    /// The next connection, read with a receive timeout of `timeoutSeconds`; `.timeout` when none
    /// arrives within that time.
    func accept(timeoutSeconds: Int) throws -> RawClient {
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        let connection = Glibc.accept(fd, nil, nil)
        guard connection >= 0 else { throw RawClient.Failure.timeout }
        return RawClient(adopting: connection, timeoutSeconds: timeoutSeconds)
    }
}
