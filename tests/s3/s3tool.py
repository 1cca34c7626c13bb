#!/usr/bin/env python3
"""A real S3-compatible server for the tests, and boto3's view of its objects.

    s3tool.py serve DIR            start SeaweedFS's `weed mini` on loopback with
                                   ports the OS chose and the test credentials;
                                   print the endpoint once a bucket can be made,
                                   then run until SIGTERM, or until stdin closes
                                   where stdin is a pipe (the server goes with it)
    s3tool.py ls BUCKET PREFIX     every object under PREFIX: "key size" lines
    s3tool.py uploads BUCKET PREFIX  the unfinished multipart uploads: "key" lines
    s3tool.py get BUCKET KEY       the object's bytes on stdout
    s3tool.py mb BUCKET            make a bucket
    s3tool.py put BUCKET KEY FILE  upload a file (boto3's upload_file)
    s3tool.py rm BUCKET KEY        delete an object

The client commands take the endpoint and credentials from the AWS_* variables,
as trainrun does. Every wait is bounded.
"""
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

VENV = os.environ.get("TRAINRUN_S3_VENV", "/opt/trainrun-s3")
ACCESS_KEY = "trainrun-test-key"
SECRET_KEY = "trainrun-test-secret"
START_TIMEOUT = 60


def free_ports(count):
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def client(endpoint=None):
    import boto3
    from botocore.config import Config
    return boto3.client(
        "s3", endpoint_url=endpoint or os.environ["AWS_ENDPOINT_URL"],
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3},
                      connect_timeout=5, read_timeout=60))


def serve(directory):
    os.makedirs(os.path.join(directory, "data"), exist_ok=True)
    config = os.path.join(directory, "s3.json")
    with open(config, "w") as f:
        f.write('{"identities":[{"name":"tester","credentials":[{"accessKey":"%s",'
                '"secretKey":"%s"}],"actions":["Admin","Read","Write","List","Tagging"]}]}'
                % (ACCESS_KEY, SECRET_KEY))
    # Every port chosen here, so that servers of tests side by side never meet;
    # kept in DIR/ports, so that a server started again on the same data
    # serves where it did.
    ports_file = os.path.join(directory, "ports")
    fresh = not os.path.exists(ports_file)
    log = open(os.path.join(directory, "weed.log"), "a")
    for _ in range(3):  # a port taken between free_ports() and weed's bind: others
        if fresh:
            ports = free_ports(11)
            with open(ports_file, "w") as f:
                f.write(" ".join(map(str, ports)))
        with open(ports_file) as f:
            ports = [int(p) for p in f.read().split()]
        (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc,
         admin, admin_grpc, metrics) = ports
        weed = subprocess.Popen(
            [os.path.join(VENV, "bin", "weed"), "mini", "-dir=" + os.path.join(directory, "data"),
             "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             "-master.port=%d" % master, "-master.port.grpc=%d" % master_grpc,
             "-volume.port=%d" % volume, "-volume.port.grpc=%d" % volume_grpc,
             "-filer.port=%d" % filer, "-filer.port.grpc=%d" % filer_grpc,
             "-s3.port=%d" % s3, "-s3.port.grpc=%d" % s3_grpc,
             "-admin.port=%d" % admin, "-admin.port.grpc=%d" % admin_grpc, "-admin.ui=false",
             "-metricsPort=%d" % metrics, "-webdav=false", "-s3.port.iceberg=0",
             "-s3.port.lance=0", "-s3.config=" + config],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            weed.wait(timeout=2)  # exited at once: most likely a port in use
        except subprocess.TimeoutExpired:
            break
        if not fresh:
            break

    def stop(*_):
        try:
            os.killpg(weed.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    endpoint = "http://127.0.0.1:%d" % s3
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if weed.poll() is not None:
            sys.stderr.write("s3tool: weed exited with %s; see %s/weed.log\n"
                             % (weed.returncode, directory))
            sys.exit(1)
        try:
            probe = client(endpoint)
            try:
                probe.create_bucket(Bucket="trainrun-probe")
            except Exception as e:
                code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
                if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise  # else started again on the same data
            # Serving objects, not only buckets: the volume server has told
            # the master about its volumes (after a restart, reads of the
            # stored objects fail until it has).
            probe.put_object(Bucket="trainrun-probe", Key="probe", Body=b"probe")
            if probe.get_object(Bucket="trainrun-probe", Key="probe")["Body"].read() == b"probe":
                break
        except Exception:
            if time.monotonic() > deadline:
                sys.stderr.write("s3tool: weed did not serve S3 within %ds\n" % START_TIMEOUT)
                stop()
            time.sleep(0.3)
    print(endpoint, flush=True)
    # Until a signal, or stdin closes (the test ended, however it ended).
    if stat.S_ISFIFO(os.fstat(0).st_mode):
        threading.Thread(target=lambda: (sys.stdin.read(), stop()), daemon=True).start()
    weed.wait()
    sys.exit(1)


def main():
    command, args = sys.argv[1], sys.argv[2:]
    if command == "serve":
        serve(args[0])
    elif command == "ls":
        paginator = client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=args[0], Prefix=args[1]):
            for o in page.get("Contents", []):
                print(o["Key"], o["Size"])
    elif command == "uploads":
        answer = client().list_multipart_uploads(Bucket=args[0], Prefix=args[1])
        for u in answer.get("Uploads", []):
            print(u["Key"])
    elif command == "get":
        body = client().get_object(Bucket=args[0], Key=args[1])["Body"].read()
        sys.stdout.buffer.write(body)
    elif command == "mb":
        client().create_bucket(Bucket=args[0])
    elif command == "put":
        client().upload_file(args[2], args[0], args[1])
    elif command == "rm":
        client().delete_object(Bucket=args[0], Key=args[1])
    else:
        sys.exit("s3tool: unknown command " + command)


if __name__ == "__main__":
    main()
