#!/usr/bin/env python3
"""Checks tools/find_cuda_libs.py on made-up installations: which NCCL it finds
for the build ($NCCL_HOME, then the system, then pip's site-packages, then the CUDA
toolkit), what it says it found, and where it finds the shared libraries the GPU
bundle needs at run time.

  test_find_cuda_libs.py PATH/TO/find_cuda_libs.py
"""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = None


def touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()


class FindCudaLibs(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        self.toolkit = os.path.join(self.root, "cuda")
        self.system = os.path.join(self.root, "usr")
        self.site = os.path.join(self.root, "site-packages")
        self.home = os.path.join(self.root, "nccl-home")
        self.links = os.path.join(self.root, "build", "nccl-link")
        os.makedirs(self.site)

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, *args, home=False):
        env = {k: v for k, v in os.environ.items() if k not in ("NCCL_HOME", "CUDA_HOME")}
        if home:
            env["NCCL_HOME"] = self.home
        cmd = [sys.executable, SCRIPT, *args, "--cuda-root", self.toolkit, "--system-prefix", self.system,
               "--site-packages", self.site]
        return subprocess.run(cmd, capture_output=True, text=True, env=env)

    def nccl(self, home=False):
        p = self.run_script("nccl", "--link-dir", self.links, home=home)
        self.assertEqual(p.returncode, 0, p.stderr)
        fields = p.stdout.rstrip("\n").split("\t")
        self.assertEqual(len(fields), 4, p.stdout)
        return fields

    def install_toolkit(self):
        touch(os.path.join(self.toolkit, "include", "nccl.h"))
        touch(os.path.join(self.toolkit, "lib64", "libnccl.so"))
        touch(os.path.join(self.toolkit, "lib64", "libnccl.so.2"))
        touch(os.path.join(self.toolkit, "lib64", "libcublas.so.13"))

    def install_pip(self):
        touch(os.path.join(self.site, "nvidia", "nccl", "include", "nccl.h"))
        touch(os.path.join(self.site, "nvidia", "nccl", "lib", "libnccl.so.2"))  # no unversioned name
        touch(os.path.join(self.site, "nvidia", "cu13", "lib", "libcublas.so.13"))

    def install_system(self):
        touch(os.path.join(self.system, "include", "nccl.h"))
        touch(os.path.join(self.system, "lib", "x86_64-linux-gnu", "libnccl.so"))

    def install_home(self):
        touch(os.path.join(self.home, "include", "nccl.h"))
        touch(os.path.join(self.home, "lib", "libnccl.so"))

    def test_order_home_system_pip_toolkit(self):
        self.install_toolkit()
        self.install_pip()
        self.install_system()
        self.install_home()
        include, link_dir, lib_dir, where = self.nccl(home=True)
        self.assertEqual(include, os.path.join(self.home, "include"))
        self.assertEqual(link_dir, os.path.join(self.home, "lib"))
        self.assertTrue(where.startswith("NCCL_HOME"), where)
        include, link_dir, lib_dir, where = self.nccl()
        self.assertTrue(where.startswith("system"), where)
        self.assertEqual(lib_dir, os.path.join(self.system, "lib", "x86_64-linux-gnu"))

    def test_pip_wheel_gets_a_link_name(self):
        self.install_toolkit()
        self.install_pip()
        include, link_dir, lib_dir, where = self.nccl()
        self.assertTrue(where.startswith("pip site-packages"), where)
        self.assertEqual(include, os.path.join(self.site, "nvidia", "nccl", "include"))
        self.assertEqual(lib_dir, os.path.join(self.site, "nvidia", "nccl", "lib"))
        self.assertEqual(link_dir, self.links)
        self.assertEqual(os.readlink(os.path.join(self.links, "libnccl.so")), os.path.join(lib_dir, "libnccl.so.2"))

    def test_toolkit_last_and_its_headers_need_no_flag(self):
        self.install_toolkit()
        include, link_dir, lib_dir, where = self.nccl()
        self.assertTrue(where.startswith("CUDA toolkit"), where)
        self.assertEqual(include, "")
        self.assertEqual(link_dir, os.path.join(self.toolkit, "lib64"))

    def test_header_without_library_is_not_nccl(self):
        touch(os.path.join(self.system, "include", "nccl.h"))
        self.install_toolkit()
        self.assertTrue(self.nccl()[3].startswith("CUDA toolkit"))

    def test_nothing_found_says_where_it_looked(self):
        p = self.run_script("nccl", "--link-dir", self.links)
        self.assertEqual(p.returncode, 1)
        self.assertIn("NCCL not found", p.stderr)
        self.assertIn(self.toolkit, p.stderr)
        self.assertIn(self.system, p.stderr)

    def test_runtime_libraries(self):
        self.install_toolkit()
        self.install_pip()
        os.remove(os.path.join(self.toolkit, "lib64", "libnccl.so.2"))
        p = self.run_script("runtime", "libcublas.so.13", "libnccl.so.2", "libmissing.so.1")
        self.assertEqual(p.returncode, 1)
        rows = [line.split("\t") for line in p.stdout.rstrip("\n").split("\n")]
        self.assertEqual(rows[0], ["libcublas.so.13", os.path.join(self.toolkit, "lib64"), "CUDA toolkit"])
        self.assertEqual(rows[1], ["libnccl.so.2", os.path.join(self.site, "nvidia", "nccl", "lib"), "pip site-packages"])
        self.assertEqual(rows[2], ["libmissing.so.1", "", ""])
        # Without the toolkit, cuBLAS comes from the CUDA 13 wheels' common directory.
        os.remove(os.path.join(self.toolkit, "lib64", "libcublas.so.13"))
        p = self.run_script("runtime", "libcublas.so.13")
        self.assertEqual(p.returncode, 0)
        self.assertEqual(p.stdout.split("\t")[1], os.path.join(self.site, "nvidia", "cu13", "lib"))


if __name__ == "__main__":
    SCRIPT = sys.argv.pop(1)
    unittest.main(verbosity=2)
