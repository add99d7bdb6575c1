#!/usr/bin/env python3
"""A TLS-terminating TCP proxy for tests: TLS on 127.0.0.1:LISTEN (certificate CERT, key KEY),
plain TCP to 127.0.0.1:UPSTREAM. It stands in for a managed service's TLS listener in front of a
test server that cannot serve TLS itself (tansu 0.6's CLI refuses --cert together with --key).
Prints "ready" once listening; runs until killed.

    scripts/tls-proxy.py LISTEN UPSTREAM CERT KEY
"""
import asyncio
import ssl
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def main() -> None:
    listen, upstream, cert, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", listen, ssl=ctx)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
